"""The documentation site: `worldlab docs` builds it from real notebooks (executed for the build), and headless
Chromium (Debian's `chromium`, driven by Playwright) opens it: no console errors, nothing fetched from the network,
every figure present and not blank, plotly figures drawn with their traces, search and navigation in lesson order.

Tests marked `browser` need Chromium: `.ci/run` installs it; elsewhere `apt-get install -y chromium` (or set
WORLDLAB_CHROMIUM). Without one they are skipped, except under CI, where that is a failure."""
import contextlib, html, io, json, os, re, shutil, subprocess, sys
from pathlib import Path

import nbformat
import pytest
from PIL import Image

from worldlab.docs import chromium_path, check_pages, page_problems

ROOT = Path(__file__).resolve().parents[1]
WORLDLAB = Path(sys.executable).parent/'worldlab'
LESSONS = ['01_camera', '02_flow', '92_docs', 'runs/make_prompts']     # 3D plotly and a table; math; a video; a run's saved figure
PAGES = ['index.html'] + [f'{p}.html' for p in LESSONS]
browser = pytest.mark.browser


@contextlib.contextmanager
def site_page(site:Path, chromium:str, path:str, **page_opts):
    "A page of the built site, served on loopback and opened in headless Chromium."
    from playwright.sync_api import sync_playwright
    from worldlab.docs import CHROMIUM_ARGS, _serve
    srv = _serve(site)
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = b.new_page(**page_opts)
            page.goto(f'http://127.0.0.1:{srv.server_address[1]}/{path}')
            yield page
            b.close()
    finally: srv.shutdown()


@pytest.fixture(scope='module')
def chromium():
    try: return chromium_path()
    except FileNotFoundError as e:
        if os.environ.get('CI'): raise
        pytest.skip(str(e))


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp('docs')/'site'
    r = subprocess.run([str(WORLDLAB), 'docs', '--only', *LESSONS, '--out', str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'failed to execute' not in r.stderr, r.stderr                   # these notebooks run through on any machine
    return out


@pytest.fixture(scope='module')
def reports(site, chromium):
    return {r['page']: r for r in check_pages(site, PAGES, shots=site.parent/'screenshots')}


def kinds(rep): return [f['kind'] for f in rep['figures']]


def _has_world_r1() -> bool:
    "Whether this checkout sees the shared World-R1 prompts (01_camera shows its table of them only then)."
    from worldlab.core import shared_dataset
    try: shared_dataset('world-r1'); return True
    except FileNotFoundError: return False


@browser
def test_pages_render_without_console_errors_or_requests_leaving_the_site(reports):
    assert set(reports) == set(PAGES)
    for page, rep in reports.items():
        assert rep['console_errors'] == [], (page, rep['console_errors'])
        assert rep['remote_requests'] == [], (page, rep['remote_requests'])   # no CDN: plotly.js and the theme are local
        assert not rep['failed_notebook'], page


@browser
def test_every_figure_is_present_and_not_blank(reports):
    assert 'img' in kinds(reports['index.html'])                                    # the hero picture
    want = {'plotly', 'table'} if _has_world_r1() else {'plotly'}                # the table counts the shared World-R1 prompt files
    assert want <= set(kinds(reports['01_camera.html'])), kinds(reports['01_camera.html'])   # frusta in 3D, that table
    assert 'plotly' in kinds(reports['02_flow.html'])
    assert 'video' in kinds(reports['92_docs.html'])
    assert 'plotly' in kinds(reports['runs/make_prompts.html'])                     # a run notebook's saved figure
    for page, rep in reports.items():
        assert page_problems(rep) == [], page_problems(rep)
        for f in rep['figures']: assert f['loaded'] and not f['blank'] and f['ink'] > 0.005, (page, f)
        assert Path(rep['screenshot']).exists()


@browser
def test_plotly_figures_are_drawn_and_interactive(site, chromium):
    with site_page(site, chromium, '02_flow.html', viewport=dict(width=1280, height=900)) as page:
        page.wait_for_function("() => document.querySelector('div.wl-plotly')?._fullLayout")
        fig = page.locator('div.wl-plotly').first
        assert fig.evaluate('d => d.data.length') > 0                           # the container has its traces
        assert fig.locator('.modebar').count() == 1                             # plotly's zoom/pan/download bar
        before = fig.evaluate("d => JSON.stringify(d._fullLayout.xaxis.range)")
        fig.evaluate("d => Plotly.relayout(d, {'xaxis.range': [0, 1]})")       # what a zoom does
        assert fig.evaluate("d => JSON.stringify(d._fullLayout.xaxis.range)") != before


def _white_png(path:Path):
    w, h = Image.open(path).size
    Image.new('RGB', (w, h), 'white').save(path)


@browser
def test_the_check_fails_on_removed_or_blank_figures(site, reports, chromium, tmp_path):
    "The same check, on copies of the site with a figure removed, blanked or emptied, reports each one."
    hero = re.search(r'src="(_images/[^"]+\.png)"', (site/'index.html').read_text())[1]
    gone = shutil.copytree(site, tmp_path/'gone')
    (gone/hero).unlink()                                                             # an image removed
    (rep,) = check_pages(gone, ['index.html'])
    assert any('img did not load' in l for l in page_problems(rep)), page_problems(rep)

    blank = shutil.copytree(site, tmp_path/'blank')
    _white_png(blank/hero)                                                           # an image that is all white
    flow = blank/'02_flow.html'                                                      # a plotly figure with no data
    flow.write_text(re.sub(r'(<script type="application/json" class="wl-plotly-spec"[^>]*>)\{"data":\[.*?\],"layout"',
                           r'\1{"data":[],"layout"', flow.read_text(), count=1, flags=re.S))
    docs = blank/'92_docs.html'                                                     # a video whose clip is gone
    docs.write_text(re.sub(r'src="data:video/mp4;base64,[^"]+"', 'src="missing.mp4"', docs.read_text()))
    problems = [l for r in check_pages(blank, ['index.html', '02_flow.html', '92_docs.html']) for l in page_problems(r)]
    assert any(l.startswith('index.html: img is blank') for l in problems), problems
    assert any(l.startswith('02_flow.html: plotly figure') and 'no traces' in l for l in problems), problems
    assert any(l.startswith('92_docs.html: video did not load') for l in problems), problems
    assert all(page_problems(reports[p]) == [] for p in ['index.html', '02_flow.html', '92_docs.html'])   # the originals pass


@browser
def test_search_finds_a_function_on_its_lesson(site, chromium):
    with site_page(site, chromium, 'search.html?q=trajectory_from_actions') as page:
        page.wait_for_selector('#search-results li a', timeout=20000)
        hrefs = page.locator('#search-results li a').evaluate_all('as => as.map(a => a.getAttribute("href"))')
        assert any(h.startswith('01_camera.html') for h in hrefs), hrefs


def test_navigation_follows_the_lesson_order(site):
    index = (site/'index.html').read_text()
    toc = re.findall(r'class="toctree-l1"><a class="reference internal" href="([^"#]+)"', index)
    assert toc[0] == 'findings.html', toc                                  # the findings come first, then the lessons
    assert toc[1:1 + len(LESSONS)] == [f'{p}.html' for p in LESSONS], toc
    nxt = re.search(r'<a class="next-page" href="([^"]+)"', (site/'01_camera.html').read_text())
    assert nxt and nxt[1] == '02_flow.html', nxt


def test_each_page_links_to_its_notebook_and_the_executed_copy(site):
    page = (site/'01_camera.html').read_text()
    links = re.findall(r'href="(_downloads/[^"]+\.ipynb)"', page)
    assert {Path(l).name for l in links} == {'01_camera.ipynb', '01_camera.executed.ipynb'}, links
    for l in links: assert (site/l).exists(), l
    ran = nbformat.read(site/next(l for l in links if l.endswith('.executed.ipynb')), as_version=4)
    assert any(c.get('outputs') for c in ran.cells if c.cell_type == 'code')       # the copy carries what the page shows
    clean = nbformat.read(ROOT/'nbs'/'01_camera.ipynb', as_version=4)
    assert not any(c.get('outputs') for c in clean.cells if c.cell_type == 'code')  # the repository's notebook stays clean


def test_api_reference_comes_from_the_library(site):
    import inspect
    from worldlab.camera import trajectory_from_actions
    page = (site/'01_camera.html').read_text()
    assert 'worldlab.camera.trajectory_from_actions' in page
    doc = inspect.getdoc(trajectory_from_actions)
    assert doc.split('`')[0] in page                                                 # the docstring as the library has it


def test_a_notebook_that_fails_is_a_marked_page_not_a_failed_build(tmp_path):
    nbs = tmp_path/'nbs'; nbs.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell('# home\n> The index.')]), nbs/'index.ipynb')
    bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell('# broken\n> Needs data that is not there.'),
                                          nbformat.v4.new_code_cell("print('before')"),
                                          nbformat.v4.new_code_cell("open('data/mini_wan/missing.pt')"),
                                          nbformat.v4.new_code_cell("print('after')")],
                                   metadata={'kernelspec': {'name': 'python3', 'display_name': 'python3', 'language': 'python'}})
    nbformat.write(bad, nbs/'01_broken.ipynb')
    cmd = [str(WORLDLAB), 'docs', '--nbs', str(nbs), '--out', str(tmp_path/'site')]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert 'failed to execute' in r.stderr and '01_broken' in r.stderr, r.stderr
    page = (tmp_path/'site'/'01_broken.html').read_text()
    assert 'This notebook failed to execute when the site was built' in page and 'FileNotFoundError' in page
    text = html.unescape(re.sub(r'<[^>]+>', '', page))                               # Pygments may write ' as &#39;
    assert 'before' in text and "print('after')" in text, text[:3000]                # outputs up to the failure; the rest unrun
    about = (tmp_path/'site'/'build.html').read_text()
    assert 'Notebooks that failed to execute' in about and '01_broken' in about
    r = subprocess.run(cmd + ['--strict'], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr                                                # --strict makes it an error
