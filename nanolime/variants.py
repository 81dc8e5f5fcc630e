"""One name for a model variant, the same in bench.py, sweep.py and train.py's log (VARIANT_GRAMMAR tells the user):

    component[:mode]  ('+' component[:mode] ...)  [@router_init]  (~key=value ...)

    lime, lime:first-2+attnres:block, mhc:static, hc8:dynamic, mudd:prepost, lime@identity~router_lr=0.002

One name, one model: each component at most once (hc and hc<N> are one component), in any order ('baseline' alone);
mhc's streams are 4, or N with hc<N> (mhc+hc8 = hc8+mhc); a '~key' may not set what the name sets (the components'
options, the router given by lime:<router>, the init given by '@'). Anything else is refused.
"""
import difflib
import re

from nanolime.common import UserError

VARIANT_COMPONENTS = {  # component -> model options; every other relative's option stays at its baseline value
    'baseline': {}, 'lime': {'lime': True}, 'hc': {'hc': 4}, 'mhc': {'hc': 4, 'mhc': 'dynamic'},
    'denseformer': {'denseformer': True}, 'attnres': {'attnres': 'full'}, 'mudd': {'mudd': True},
    'moda': {'moda': True}, 'depthattn': {'depth_attention': True}}
VARIANT_MODES = {'lime': 'router', 'attnres': 'attnres', 'mhc': 'mhc', 'hc': 'hc_dynamic',
                 'mudd': 'mudd_prepost'}  # what ':' sets
VARIANT_SWITCHES = {'hc_dynamic': 'dynamic', 'mudd_prepost': 'prepost'}  # modes that switch an option on: their one name
VARIANT_PLAIN = {'lime': False, 'hc': 0, 'hc_dynamic': False, 'mhc': '', 'denseformer': False, 'attnres': '',
                 'mudd': False, 'mudd_prepost': False, 'moda': False,
                 'depth_attention': False}  # the baseline: every variant sets all of these
VARIANT_GRAMMAR = ("components baseline, lime, hc, hc<N>, mhc, denseformer, attnres, mudd, moda, depthattn "
                   "joined by '+', each at most once, in any order (mhc+hc8: mHC with 8 streams); "
                   "a mode after ':' (lime:first-2, attnres:block, mhc:static, hc:dynamic, mudd:prepost); "
                   "LIMe's router init after '@' (lime@identity); train.py options after '~' (lime~router_lr=0.002)")


def variant_name(lime=False, router='full', router_init='paper', hc=0, hc_dynamic=False, mhc='', denseformer=False,
                 attnres='', mudd=False, moda=False, mudd_prepost=False, depth_attention=False):
    """The variant name of a model's options, in parse_variant's grammar (without '~' options): 'baseline',
    'lime', 'lime:first-2+attnres:block', 'mhc:static', 'hc8:dynamic', 'lime@identity', ..."""
    parts = [] if not lime else ['lime' if router == 'full' else f'lime:{router}']
    if mhc:
        parts += ['mhc' if mhc == 'dynamic' else f'mhc:{mhc}'] + ([f'hc{hc}'] if hc != 4 else [])
    elif hc:
        parts += [('hc' if hc == 4 else f'hc{hc}') + (':dynamic' if hc_dynamic else '')]
    parts += ['denseformer'] * bool(denseformer)
    if attnres:
        parts += ['attnres' if attnres == 'full' else f'attnres:{attnres}']
    parts += [f"mudd{':prepost' if mudd_prepost else ''}"] * bool(mudd) + ['moda'] * bool(moda)
    parts += ['depthattn'] * bool(depth_attention)
    return '+'.join(parts or ['baseline']) + (f'@{router_init}' if lime and router_init != 'paper' else '')


def parse_variant(variant):
    """(model options, the '~' options as text) of a variant name. The model options set every key of VARIANT_PLAIN,
    plus router and router_init where the name gives them; GPTConfig checks the values."""
    name, *overrides = variant.split('~')
    pairs = [o.partition('=')[::2] for o in overrides]
    if any(not k or not v for k, v in pairs):
        raise UserError(f"variant '{variant}': expected '~key=value' with a train.py option, e.g. lime~router_lr=0.002")
    extra = dict(pairs)
    if len(extra) < len(pairs):
        raise UserError(f"variant '{variant}': a key is given twice after '~'; give each once")
    name, _, init = name.partition('@')
    opts, seen, rates = dict(VARIANT_PLAIN), {}, []  # seen: component -> its part of the name
    parts = name.split('+')
    for part in parts:
        component, colon, mode = part.partition(':')
        rate = re.fullmatch(r'hc([1-9]\d*)', component)  # hc0 would be the baseline
        if component not in VARIANT_COMPONENTS and not rate:
            close = difflib.get_close_matches(component, list(VARIANT_COMPONENTS), n=1)
            raise UserError(f"unknown variant '{component}' in '{variant}'"
                            f"{f'; did you mean {close[0]!r}?' if close else ''}: {VARIANT_GRAMMAR}")
        family = 'hc' if rate else component
        if family in seen:
            raise UserError(f"variant '{variant}': '{part}' repeats '{seen[family]}'; name each component once "
                            "(hc<N> sets the streams of hc and of mhc)")
        seen[family] = part
        if rate or component == 'hc':
            rates.append(int(rate[1]) if rate else 4)
        opts.update({} if rate else VARIANT_COMPONENTS[component])
        key = VARIANT_MODES.get('hc' if rate else component)
        if colon and (not key or not mode or key in VARIANT_SWITCHES and mode != VARIANT_SWITCHES[key]):
            modes = ', '.join(f'{c}:{VARIANT_SWITCHES[k]}' if k in VARIANT_SWITCHES else f'{c}:<{k}>'
                              for c, k in VARIANT_MODES.items())
            raise UserError(f"variant '{variant}': '{part}' takes no such mode; modes: {modes}")
        if colon:
            opts[key] = True if key in VARIANT_SWITCHES else mode
    if 'baseline' in seen and len(parts) > 1:
        raise UserError(f"variant '{variant}': 'baseline' stands alone; name only the other components")
    if rates:  # hc or hc<N>: the streams, of mhc too (whichever comes first)
        opts['hc'] = rates[0]
    if '@' in variant.split('~')[0]:
        if not init:
            raise UserError(f"variant '{variant}': no router init after '@'; name one (lime@identity), or leave '@' "
                            "out")
        if not opts['lime']:
            raise UserError(f"variant '{variant}': a router init ('@') needs lime, e.g. lime@identity")
        opts['router_init'] = init
    named = {**{k: 'the name' for k in VARIANT_PLAIN}, **{k: f"'{seen['lime']}'" for k in ['router'] if k in opts},
             **({'router_init': f"'@{init}'"} if init else {})}
    for key, value in extra.items():
        if key in named:
            raise UserError(f"variant '{variant}': '~{key}={value}' sets {key}, which {named[key]} sets; give it once, "
                            f"in the name: {VARIANT_GRAMMAR}")
    return opts, extra
