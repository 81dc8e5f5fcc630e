"""
The statistics of sweep.py's tables: 95% t intervals over seeds, how a difference reads against its interval,
p-values of paired differences (paired t test, exact sign test), Holm's adjustment over a table's tests, and
least-squares slopes with their interval, p-value and the slope a test of them detects at a given power. Plain
functions of lists of numbers, so they also serve for a sweep.csv of your own:

    import csv; from nanolime.sweep_stats import mean_ci
    rows = [r for r in csv.DictReader(open('out-sweep/sweep.csv')) if r['status'] == 'done']
    print(mean_ci([float(r['val_loss']) for r in rows if r['variant'] == 'lime']))
"""
import math

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

def mean_ci(xs):
    """(mean, half-width of its 95% t interval); the half-width is nan for fewer than 2 values."""
    n, m = len(xs), sum(xs) / len(xs)
    if n < 2:
        return m, math.nan
    t = T95[n - 2] if n <= 31 else 1.96 + 2.4 / (n - 1)  # beyond 30 degrees of freedom: within 0.002 of t
    return m, t * math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)

def verdict(diff, half, lower_is_better=True):
    """How a difference (variant - control) with its interval reads: for a loss, lower is better."""
    if math.isnan(half):
        return "no interval (one seed)"
    if diff - half <= 0 <= diff + half:
        return "inside seed noise"
    return "better" if (diff < 0) == lower_is_better else "worse"

def t_test_p(diffs):
    """Two-sided p-value of the paired t test: P(|T| >= |t|), T Student's t with n - 1 degrees of freedom and
    t = mean / (sd / sqrt(n)) of the n differences, exact for integer degrees of freedom (Abramowitz & Stegun
    26.7.3-4: a finite series in cos(theta), tan(theta) = t / sqrt(n - 1)). nan for fewer than 2 differences."""
    n = len(diffs)
    if n < 2:
        return math.nan
    m = sum(diffs) / n
    se = math.sqrt(sum((x - m) ** 2 for x in diffs) / (n - 1) / n)
    return t_p(m, se, n - 1)

def t_p(estimate, se, nu):
    """Two-sided p-value of estimate / se against Student's t with nu degrees of freedom (t_test_p's series)."""
    if se == 0:  # no spread: t is infinite, or 0 / 0 when the estimate is 0
        return float(estimate == 0)
    theta = math.atan(abs(estimate) / se / math.sqrt(nu))
    c2, term, total, odd = math.cos(theta) ** 2, 1.0, 1.0, nu % 2
    for k in range(1, (nu - 1) // 2 if odd else nu // 2):  # term ratios: odd 2k / (2k+1), even (2k-1) / (2k)
        term *= c2 * (2 * k - 1 + odd) / (2 * k + odd)
        total += term
    inside = 2 / math.pi * (theta + (nu > 1) * math.sin(theta) * math.cos(theta) * total) if odd else (
        math.sin(theta) * total)  # P(|T| < t)
    return max(0.0, 1.0 - inside)

def slope_fit(xs, ys):
    """Least-squares slope of ys on xs: (slope, its standard error, degrees of freedom n - 2); the standard error is
    nan for fewer than 3 points."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if n < 3:
        return slope, math.nan, n - 2
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return slope, math.sqrt(residual / (n - 2) / sxx), n - 2

def slope_ci(xs, ys):
    """Least-squares slope of ys on xs: (slope, half-width of its 95% t interval, two-sided p of a zero slope),
    n - 2 degrees of freedom; the half-width and p are nan for fewer than 3 points. sweep.py's depth trend:
    the paired differences of every seed and depth on log2(depth)."""
    slope, se, df = slope_fit(xs, ys)
    if df < 1:
        return slope, math.nan, math.nan
    t = T95[df - 1] if df <= 30 else 1.96 + 2.4 / df
    return slope, t * se, t_p(slope, se, df)

def t_quantile(q, nu):
    """The q-quantile of Student's t with nu degrees of freedom, for 0.5 <= q < 1: the t at which P(T <= t) =
    1 - t_p(t, 1, nu) / 2 reaches q, by bisection (t_p's series is exact for integer nu)."""
    low, high = 0.0, 1.0
    while 1 - t_p(high, 1.0, nu) / 2 < q:
        high *= 2
    for _ in range(60):  # the interval halves each step: far below any printed digit
        mid = (low + high) / 2
        low, high = (mid, high) if 1 - t_p(mid, 1.0, nu) / 2 < q else (low, mid)
    return (low + high) / 2

def detectable(se, df, alpha=0.05, power=0.8):
    """The smallest true value (a slope, a difference) that a two-sided t test at level alpha of an estimate with
    standard error se and df degrees of freedom finds with the given power: (t_{1-alpha/2,df} + t_{power,df}) x se
    (the usual approximation: the estimate must land beyond the critical value, which it does with chance `power`
    when the truth lies t_{power} standard errors further out). nan without a standard error."""
    if df < 1 or math.isnan(se):
        return math.nan
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * se

def sign_test_p(diffs):
    """Exact two-sided sign test: zero differences dropped, n left, k of them on the rarer side; under no
    difference each sign is + or - with chance 1/2, and the p-value is the chance of a split at least as
    lopsided, min(1, 2 * sum_{i <= k} C(n, i) / 2^n) (1 when no difference is left)."""
    pos, neg = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
    return min(1.0, 2 * sum(math.comb(pos + neg, i) for i in range(min(pos, neg) + 1)) / 2 ** (pos + neg))

def holm(ps):
    """Holm-Bonferroni adjusted p-values, in the order given: with the m p-values sorted, p_(1) <= ... <= p_(m),
    the i-th becomes max over j <= i of min(1, (m - j + 1) p_(j)); calling 'different' every test whose adjusted
    value is <= alpha keeps the chance of any false call among the m at most alpha. nan (no test) stays nan and
    is not counted in m."""
    order = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - j) * ps[i]))  # the max keeps the order of the p-values
        out[i] = running
    return out
