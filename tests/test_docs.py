"""The documentation's own checks: no words that date a page, relative links that resolve, and
docs/README.md indexing every page of docs/. Plain text reading, no torch."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'


def pages():
    """README.md, every docs/*.md page and the studies' pages under experiments/."""
    return [ROOT / 'README.md'] + sorted(DOCS.glob('*.md')) + sorted((ROOT / 'experiments').rglob('*.md'))


# Words whose meaning depends on when the page is read: a page names the date instead.
TIME_RELATIVE = re.compile(r"\b(today'?s?|this morning|yesterday|tonight|this session)\b", re.IGNORECASE)


def time_relative_words(text):
    """(line number, word) for each time-relative word in text."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for m in TIME_RELATIVE.finditer(line)]


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped except hyphens, spaces to hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip())   # a link in a heading: its text
    text = text.lower().replace('`', '')
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def strip_code(text):
    """text without fenced code blocks (their lines kept, blanked) and without inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(('```', '~~~')):
            fenced = not fenced
            out.append('')
            continue
        out.append('' if fenced else re.sub(r'`[^`]*`', '', line))
    return '\n'.join(out)


def anchors(path):
    """Every heading anchor of a markdown file (headings in fenced code are not headings); a repeated
    heading gets -1, -2, ..."""
    seen, result, fenced = {}, set(), False
    for line in path.read_text(encoding='utf-8').splitlines():
        if line.lstrip().startswith(('```', '~~~')):
            fenced = not fenced
        m = None if fenced else re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f'{base}-{n}')
    return result


LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')


def relative_links(text):
    """(line number, target) for each markdown link or image outside code whose target is not a URL."""
    found = []
    for n, line in enumerate(strip_code(text).splitlines(), 1):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.IGNORECASE):  # http:, https:, mailto:
                continue
            found.append((n, target))
    return found


def broken_links(path):
    """'line: target (why)' for each relative link of path that does not resolve."""
    problems = []
    for n, target in relative_links(path.read_text(encoding='utf-8')):
        file_part, _, anchor = target.partition('#')
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f'{path.name}:{n}: {target} (no such file)')
        elif anchor and dest.suffix == '.md' and anchor not in anchors(dest):
            problems.append(f'{path.name}:{n}: {target} (no heading #{anchor} in {dest.name})')
    return problems


def test_slug_follows_github():
    assert slug('Deep LIMe\'s scatter at 32 layers × 64') == 'deep-limes-scatter-at-32-layers--64'
    assert slug('Data (`prepare.py`)') == 'data-preparepy'
    assert slug('GPU acceptance: dev/gpu_check.py') == 'gpu-acceptance-devgpu_checkpy'
    assert slug('Arithmetic, tier 2') == 'arithmetic-tier-2'


def test_anchors_number_repeated_headings(tmp_path):
    page = tmp_path / 'p.md'
    page.write_text('# A\n## Notes\n```sh\n# not a heading\n```\n## Notes\n## Notes\n')
    assert anchors(page) == {'a', 'notes', 'notes-1', 'notes-2'}


def test_checks_catch_what_they_are_for(tmp_path):
    assert time_relative_words("a rerun today.\nToday's code\nthis session\nTODAYS") == [
        (1, 'today'), (2, "Today's"), (3, 'this session'), (4, 'TODAYS')]
    assert time_relative_words('todayish, holiday, yesterdays') == []
    (tmp_path / 'b.md').write_text('# B\n## Two words\n')
    page = tmp_path / 'a.md'
    page.write_text('[ok](b.md#two-words) [self](#a) ![img](b.md) `[code](nowhere.md)` [web](https://x.y/z)\n'
                    '# A\n[bad](c.md) [bad anchor](b.md#three)\n')
    assert broken_links(page) == ['a.md:3: c.md (no such file)',
                                  'a.md:3: b.md#three (no heading #three in b.md)']


@pytest.mark.parametrize('page', pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_time_relative_words(page):
    """'today', 'this morning' and the like go stale: a page names the date or says it plainly."""
    found = time_relative_words(page.read_text(encoding='utf-8'))
    assert not found, f'{page.name}: ' + ', '.join(f'line {n}: {w!r}' for n, w in found)


@pytest.mark.parametrize('page', pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Every relative link and image names an existing file, and every #anchor a heading in it."""
    assert not broken_links(page), '\n'.join(broken_links(page))


def test_docs_index_lists_every_page():
    index = DOCS / 'README.md'
    assert index.exists(), 'docs/README.md, the index of docs/, is missing'
    linked = {Path(target.partition('#')[0]).name for _, target in relative_links(index.read_text(encoding='utf-8'))}
    missing = [p.name for p in sorted(DOCS.glob('*.md')) if p.name != 'README.md' and p.name not in linked]
    assert not missing, f'docs/README.md does not link to: {", ".join(missing)}'


def test_readme_is_at_most_14_kb():
    """README is the teaching page; what is longer goes to docs/ (docs/README.md indexes it)."""
    size = len((ROOT / 'README.md').read_bytes())
    assert size <= 14 * 1024, f'README.md is {size:,} bytes, over 14 KB ({14 * 1024:,}): move detail to docs/'


def readme_tree():
    """(the paths README's file tree ("What is where") starts its lines with, every path it names): a line
    starts with a path or two ('docs/, tests/'); a folder's line and the indented lines under it may name its
    files ('relatives/  ... attnres.py, moda.py')."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    block = text.split('## What is where', 1)[1].split('```', 2)[1]
    heads, named, folder = [], set(), ''
    for line in block.splitlines()[1:]:
        if line and not line[0].isspace():
            first = re.match(r'^([^\s,]+(?:,\s[^\s,]+)*)', line).group(1)
            paths = [n.strip() for n in first.split(',')]
            heads += paths
            named.update(paths)
            folder = paths[0] if len(paths) == 1 and paths[0].endswith('/') else ''
            line = line[len(first):]
        named.update(folder + name for name in re.findall(r'(?<![\w/<*])(\w+\.py)\b', line) if folder)
    return heads, named


def code_files():
    """The Python files a reader of the code meets: the scripts at the top and each package's modules
    (tests/ aside; config/ and dev/ are named as folders)."""
    packages = [d for d in ROOT.iterdir() if (d / '__init__.py').exists() and d.name != 'tests']
    files = list(ROOT.glob('*.py')) + [f for d in packages for f in d.glob('*.py') if f.name != '__init__.py']
    return sorted(f.relative_to(ROOT).as_posix() for f in files)


def test_readme_tree_names_every_code_file_and_nothing_gone():
    heads, named = readme_tree()
    assert len(heads) >= 10, heads
    gone = [n for n in sorted(named) if not (ROOT / n).exists()]
    assert not gone, f"README's file tree names what is not there: {gone}"
    missing = [f for f in code_files() if f not in named]
    assert not missing, f"README's file tree has no line for: {missing} (one line per file)"


# A path on the machine a page was written on: a reader's clone has no such file
OUTSIDE = re.compile(r'(?<![\w.~-])/(?:work|home|Users|root|mnt|opt|srv)/[\w./-]+')


@pytest.mark.parametrize('page', pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_cites_a_file_outside_the_repository(page):
    found = OUTSIDE.findall(page.read_text(encoding='utf-8'))
    assert not found, f'{page.name} cites files outside the repository: {found}'


def test_outside_paths_are_told_from_the_repositorys():
    assert OUTSIDE.findall('the text in `/work/shared/paper/x.txt`, /home/me/a.py') == [
        '/work/shared/paper/x.txt', '/home/me/a.py']
    assert OUTSIDE.findall('docs/work/x.md, https://github.com/work/x, model.py, /tmp/run') == []
