"""
The statistics of sweep.py's tables: 95% t intervals over seeds, how a difference reads against its interval,
p-values of paired differences (paired t test, exact sign test), Holm's adjustment over a table's tests, and
least-squares slopes with their interval, p-value and the slope a test of them detects at a given power; the
distributions are scipy.stats'. Plain functions of lists of numbers, so they also serve for a sweep.csv of your
own:

    import csv; from nanolime.sweep_stats import mean_ci
    rows = [r for r in csv.DictReader(open('out-sweep/sweep.csv')) if r['status'] == 'done']
    print(mean_ci([float(r['val_loss']) for r in rows if r['variant'] == 'lime']))
"""
import math
import statistics

from scipy import stats


def t95(df):
    """The two-sided 95% quantile of Student's t with df degrees of freedom, to 3 decimals as t tables print it
    and as every table of this repository was made (the exact quantile moves some half-widths in their 4th
    digit): a 95% interval is +- t95 x se."""
    return round(float(stats.t.ppf(0.975, df)), 3)

def mean_ci(xs):
    """(mean, half-width of its 95% t interval); the half-width is nan for fewer than 2 values."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))

def verdict(diff, half, lower_is_better=True):
    """How a difference (variant - control) with its interval reads: for a loss, lower is better."""
    if math.isnan(half):
        return "no interval (one seed)"
    if diff - half <= 0 <= diff + half:
        return "inside seed noise"
    return "better" if (diff < 0) == lower_is_better else "worse"

def t_test_p(diffs):
    """Two-sided p-value of the paired t test of the differences: t = mean / (sd / sqrt(n)) against Student's
    t with n - 1 degrees of freedom. nan for fewer than 2 differences."""
    if len(diffs) < 2:
        return math.nan
    return t_p(statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs) - 1)

def t_p(estimate, se, nu):
    """Two-sided p-value of estimate / se against Student's t with nu degrees of freedom: P(|T| >= |t|)."""
    if se == 0:  # no spread: t is infinite, or 0 / 0 when the estimate is 0
        return float(estimate == 0)
    return float(2 * stats.t.sf(abs(estimate) / se, nu))

def slope_fit(xs, ys):
    """Least-squares slope of ys on xs: (slope, its standard error, degrees of freedom n - 2); the standard
    error is nan for fewer than 3 points."""
    fit = stats.linregress(xs, ys)
    return float(fit.slope), float(fit.stderr) if len(xs) > 2 else math.nan, len(xs) - 2

def slope_ci(xs, ys):
    """Least-squares slope of ys on xs: (slope, half-width of its 95% t interval, two-sided p of a zero slope),
    n - 2 degrees of freedom; the half-width and p are nan for fewer than 3 points. sweep.py's depth trend:
    the paired differences of every seed and depth on log2(depth)."""
    slope, se, df = slope_fit(xs, ys)
    if df < 1:
        return slope, math.nan, math.nan
    return slope, t95(df) * se, t_p(slope, se, df)

def detectable(se, df, alpha=0.05, power=0.8):
    """The smallest true value (a slope, a difference) that a two-sided t test at level alpha of an estimate with
    standard error se and df degrees of freedom finds with the given power: (t_{1-alpha/2,df} + t_{power,df}) x se
    (the usual approximation: the estimate must land beyond the critical value, which it does with chance `power`
    when the truth lies t_{power} standard errors further out). nan without a standard error."""
    if df < 1 or math.isnan(se):
        return math.nan
    return float(stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se

def sign_test_p(diffs):
    """Exact two-sided sign test: zero differences dropped; under no difference each sign is + or - with
    chance 1/2, and the p-value is the chance of a split at least as lopsided (1 when none is left)."""
    pos, neg = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
    return float(stats.binomtest(pos, pos + neg).pvalue) if pos + neg else 1.0

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
