"""nanolime/variants.py: the one name of a model variant that bench.py, sweep.py and train.py's log share."""
import re

import pytest

from nanolime import variants
from nanolime.common import UserError


def test_variant_grammar():
    """One name per model variant (bench.py and sweep.py read it): components joined by '+', a mode after ':', the
    router init after '@', options after '~'; every relative's option set, the unnamed ones to the baseline's."""
    parse, plain = variants.parse_variant, variants.VARIANT_PLAIN
    assert parse('baseline') == (plain, {})
    assert parse('moda') == ({**plain, 'moda': True}, {}) and parse('mudd') == ({**plain, 'mudd': True}, {})
    assert parse('mudd:prepost') == ({**plain, 'mudd': True, 'mudd_prepost': True}, {})
    assert parse('depthattn') == ({**plain, 'depth_attention': True}, {})
    assert parse('lime+mudd:prepost')[0] == {**plain, 'lime': True, 'mudd': True, 'mudd_prepost': True}
    assert parse('lime+hc')[0] == {**plain, 'lime': True, 'hc': 4} and parse('hc8')[0] == {**plain, 'hc': 8}
    assert parse('hc8:dynamic')[0] == {**plain, 'hc': 8, 'hc_dynamic': True}
    assert parse('mhc')[0] == {**plain, 'hc': 4, 'mhc': 'dynamic'} == parse('mhc:dynamic')[0]
    assert parse('mhc:static')[0] == {**plain, 'hc': 4, 'mhc': 'static'}
    assert parse('attnres')[0] == {**plain, 'attnres': 'full'} and parse('attnres:block')[0]['attnres'] == 'block'
    assert parse('lime:first-2+attnres:block-4')[0] == {**plain, 'lime': True, 'router': 'first-2',
                                                        'attnres': 'block-4'}
    assert parse('lime:last-2@identity')[0] == {**plain, 'lime': True, 'router': 'last-2', 'router_init': 'identity'}
    assert parse('lime@identity~router_lr=1e-3~weight_decay=0') == (
        {**plain, 'lime': True, 'router_init': 'identity'}, {'router_lr': '1e-3', 'weight_decay': '0'})
    for bad, message in [('lim', "unknown variant 'lim' in 'lim'; did you mean 'lime'?"),
                         ('hc0', "unknown variant 'hc0'"), ('baseline+xyz', "unknown variant 'xyz'"),
                         ('mudd:x', "'mudd:x' takes no such mode"), ('hc:static', "'hc:static' takes no such mode"),
                         ('mudd:prenorm', "modes: lime:<router>, hc:dynamic, mhc:<mhc>, attnres:<attnres>, mudd:prepost"),
                         ('moda:prepost', "'moda:prepost' takes no such mode"),
                         ('lime:', "'lime:' takes no such mode"), ('hc@identity', "needs lime"),
                         ('lime@', "no router init after '@'"), ('lime:first-2@~router_lr=1', "no router init"),
                         ('lime~router_lr', "expected '~key=value'"), ('lime~=3', "expected '~key=value'"),
                         ('lime~a=1~a=2', "a key is given twice after '~'")]:
        with pytest.raises(UserError, match=re.escape(message)):
            parse(bad)


def test_variant_name_inverts_parse_variant():
    """train.py names its model by variant_name; parsing that name gives back the same options."""
    names = ['baseline', 'lime', 'lime:first-2', 'lime:last-2@identity', 'lime@identity', 'hc', 'hc8', 'hc:dynamic',
             'hc8:dynamic', 'mhc', 'mhc:static', 'mhc+hc8', 'denseformer', 'attnres', 'attnres:block-4', 'mudd', 'mudd:prepost', 'moda',
             'lime+attnres:block', 'lime:average+mhc:static+denseformer+attnres+moda+mudd@identity',
             'lime:last-2+mudd:prepost', 'depthattn']
    defaults = {'router': 'full', 'router_init': 'paper'}
    for name in names:
        opts = {**defaults, **variants.parse_variant(name)[0]}
        assert variants.variant_name(opts) == name
    assert variants.variant_name({}) == 'baseline'
    assert variants.variant_name({'router': 'first-2', 'router_init': 'identity'}) == 'baseline'  # need lime


def test_a_name_has_one_meaning_whatever_the_order():
    """Components commute: hc<N> gives mHC its streams whichever comes first (mhc alone: 4)."""
    parse, plain = variants.parse_variant, variants.VARIANT_PLAIN
    assert parse('hc8+mhc') == parse('mhc+hc8') == ({**plain, 'hc': 8, 'mhc': 'dynamic'}, {})
    assert parse('mhc:static+hc2')[0] == parse('hc2+mhc:static')[0] == {**plain, 'hc': 2, 'mhc': 'static'}
    assert parse('attnres+lime:first-2')[0] == parse('lime:first-2+attnres')[0]


@pytest.mark.parametrize('bad, message', [
    ('hc+hc8', "'hc8' repeats 'hc'"), ('hc8+hc', "'hc' repeats 'hc8'"),
    ('attnres:block+attnres', "'attnres' repeats 'attnres:block'"), ('mhc:static+mhc', "'mhc' repeats 'mhc:static'"),
    ('lime+lime', "'lime' repeats 'lime'"), ('baseline+lime', "'baseline' stands alone"),
    ('lime:average~router=first-2', "'~router=first-2' sets router, which 'lime:average' sets"),
    ('lime@identity~router_init=paper', "'~router_init=paper' sets router_init, which '@identity' sets"),
    ('lime~lime=False', "'~lime=False' sets lime, which the name sets"),
    ('mhc~hc=8', "'~hc=8' sets hc, which the name sets"),
])
def test_repeated_or_conflicting_components_are_refused(bad, message):
    with pytest.raises(UserError, match=re.escape(f"variant '{bad}': {message}")) as e:
        variants.parse_variant(bad)
    assert '\n' not in str(e.value)
