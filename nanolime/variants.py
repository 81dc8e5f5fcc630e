"""One name for a model variant, the same in bench.py, sweep.py and train.py's log (VARIANT_GRAMMAR
tells the user):

    component[:mode]  ('+' component[:mode] ...)  [@router_init]  (~key=value ...)

    lime, lime:first-2+attnres:block, mhc:static, hc8:dynamic, mudd:prepost, lime@identity~router_lr=0.002

One name, one model: each component at most once (hc and hc<N> are one component), in any order
('baseline' alone); mhc's streams are 4, or N with hc<N> (mhc+hc8 = hc8+mhc); a '~key' may not set
what the name sets (the components' options, the router given by lime:<router>, the init given by
'@'). Anything else is refused. The components are model.py's, baseline and lime, and each
relative's, declared in its file (relatives/base.py's Component).
"""
import dataclasses
import difflib
import re

import relatives
from nanolime.common import UserError
from relatives.base import Component

LIME = {'lime': Component({'lime': True}, mode='router')}  # model.py's method; its init after '@'
VARIANT_COMPONENTS = {'baseline': Component({}), **LIME, **{
    name: c for relative in relatives.RELATIVES for name, c in relative.components.items()}}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(relatives.RelativesConfig)}
# the baseline's value of every option a component sets: every variant sets all of these
VARIANT_PLAIN = {key: DEFAULTS[key] for c in VARIANT_COMPONENTS.values()
                 for key in [*c.options, *[c.mode] * bool(c.word), *[c.number] * bool(c.number)]}
MODES = ', '.join(f"{name}:{c.word or f'<{c.mode}>'}"  # lime:<router>, hc:dynamic, ...
                  for name, c in VARIANT_COMPONENTS.items() if c.mode)
VARIANT_GRAMMAR = ("components " + ', '.join(name + f', {name}<N>' * bool(c.number)
                                             for name, c in VARIANT_COMPONENTS.items())
                   + " joined by '+', each at most once, in any order; a mode after ':' "
                   f"({MODES}); LIMe's router init after '@' (lime@identity); train.py options "
                   "after '~' (lime~router_lr=0.002)")


def named(components, config):
    """The parts of a variant name that name `components` (one relative's, or LIME) in `config`
    (every option): [] when none is on; else the last whose options are all set, with its number and
    mode, and a number that another of them takes as a part of its own (mhc+hc8)."""
    on = [name for name, c in components.items() if c.options and all(map(config.get, c.options))]
    if not on:
        return []
    name, c = on[-1], components[on[-1]]
    numbered = {other.number: n for n, other in components.items() if other.number}  # option: by
    part, more = name, []
    for key in c.options:
        if key in numbered and config[key] != c.options[key]:
            if numbered[key] == name:
                part += str(config[key])
            else:
                more.append(f'{numbered[key]}{config[key]}')
    default = c.options.get(c.mode, DEFAULTS.get(c.mode))  # what the bare name leaves the mode at
    if c.mode and (config[c.mode] if c.word else config[c.mode] != default):
        part += f':{c.word or config[c.mode]}'
    return [part] + more


def variant_name(config):
    """The variant name of a model's options (a dict, such as train.py's config; an option it lacks
    is the baseline's), in parse_variant's grammar without '~' options: 'baseline', 'lime',
    'lime:first-2+attnres:block', 'mhc:static', 'hc8:dynamic', 'lime@identity', ..."""
    config = {**DEFAULTS, **config}
    parts = [part for components in [LIME] + [r.components for r in relatives.RELATIVES]
             for part in named(components, config)]
    lime_init = config['lime'] and config['router_init'] != 'paper'
    return '+'.join(parts or ['baseline']) + f"@{config['router_init']}" * lime_init


def component_of(word):
    """(the component, the number after its name or None) of a part's name before ':' (hc8: 'hc',
    8), or None."""
    if word in VARIANT_COMPONENTS:
        return word, None
    for name, c in VARIANT_COMPONENTS.items():
        number = c.number and re.fullmatch(re.escape(name) + r'([1-9]\d*)', word)  # hc0: no hc
        if number:
            return name, int(number[1])
    return None


def parse_variant(variant):
    """(model options, the '~' options as text) of a variant name. The model options set every key
    of VARIANT_PLAIN, plus router and router_init where the name gives them; GPTConfig checks the
    values."""
    name, *overrides = variant.split('~')
    pairs = [o.partition('=')[::2] for o in overrides]
    if any(not k or not v for k, v in pairs):
        raise UserError(f"variant '{variant}': expected '~key=value' with a train.py option, e.g. "
                        "lime~router_lr=0.002")
    extra = dict(pairs)
    if len(extra) < len(pairs):
        raise UserError(f"variant '{variant}': a key is given twice after '~'; give each once")
    name, _, init = name.partition('@')
    opts, numbers = dict(VARIANT_PLAIN), {}
    seen, named_by = {}, {}  # component -> its part of the name; option -> the part that sets it
    parts = name.split('+')
    for part in parts:
        word, colon, mode = part.partition(':')
        if component_of(word) is None:
            close = difflib.get_close_matches(word, list(VARIANT_COMPONENTS), n=1)
            raise UserError(f"unknown variant '{word}' in '{variant}'"
                            f"{f'; did you mean {close[0]!r}?' if close else ''}: {VARIANT_GRAMMAR}")
        component, number = component_of(word)
        if component in seen:
            raise UserError(f"variant '{variant}': '{part}' repeats '{seen[component]}'; name each "
                            "component once (a number after a name, as in hc8, is that one's)")
        seen[component] = part
        c = VARIANT_COMPONENTS[component]
        opts.update(c.options)
        if number is not None:  # set after every component's options: hc8+mhc = mhc+hc8
            numbers[c.number] = number
        if colon and (not c.mode or not mode or c.word and mode != c.word):
            raise UserError(f"variant '{variant}': '{part}' takes no such mode; modes: {MODES}")
        if colon:
            opts[c.mode] = True if c.word else mode
            named_by[c.mode] = f"'{part}'"
    opts.update(numbers)
    if 'baseline' in seen and len(parts) > 1:
        raise UserError(f"variant '{variant}': 'baseline' stands alone; name only the other components")
    if '@' in variant.split('~')[0]:
        if not init:
            raise UserError(f"variant '{variant}': no router init after '@'; name one "
                            "(lime@identity), or leave '@' out")
        if not opts['lime']:
            raise UserError(f"variant '{variant}': a router init ('@') needs lime, e.g. lime@identity")
        opts['router_init'] = init
        named_by['router_init'] = f"'@{init}'"
    named_by = {**{k: 'the name' for k in VARIANT_PLAIN}, **named_by}
    for key, value in extra.items():
        if key in named_by:
            raise UserError(f"variant '{variant}': '~{key}={value}' sets {key}, which "
                            f"{named_by[key]} sets; give it once, in the name: {VARIANT_GRAMMAR}")
    return opts, extra
