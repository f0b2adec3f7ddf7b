"Every figure of the main job exists as a PNG that is not blank, and survives where plotly cannot run."
import json, os, re, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worldlab.figures import find_chrome

# The PNGs come from kaleido, which drives a Chrome or Chromium: without one (and outside CI, which installs it) the
# run still writes its HTML, and the checks of its PNGs are skipped, as the documentation site's browser tests are.
needs_browser = pytest.mark.skipif(find_chrome() is None and not os.environ.get('CI'),
                                   reason='no Chrome or Chromium for kaleido: apt-get install -y chromium')

ROOT = Path(__file__).resolve().parents[1]
WORLDLAB = Path(sys.executable).parent/'worldlab'


def ink(img:Image.Image) -> float:
    "Share of pixels that differ from the most common colour (0 for a blank picture)."
    a = np.asarray(img.convert('RGB')).reshape(-1, 3)
    return 1 - np.unique(a, axis=0, return_counts=True)[1].max()/len(a)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('outputs')
    r = subprocess.run([str(WORLDLAB), 'run', 'walkthrough', '--preset', 'tiny', '--out', str(out), '--quiet'],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    (d,) = list((out/'walkthrough').iterdir())
    return d


@needs_browser
def test_every_html_figure_has_a_png_that_is_not_blank(run):
    htmls = sorted(p.stem for p in run.glob('*.html'))
    assert {'trajectory', 'flow', 'noise', 'world'} <= set(htmls), htmls
    for name in htmls:
        png = run/f'{name}.png'
        assert png.exists(), f"{name}.html has no {name}.png beside it"
        img = Image.open(png)
        assert min(img.size) >= 200, (name, img.size)
        assert ink(img) > 0.02, f"{name}.png looks blank (ink {ink(img):.4f})"


@needs_browser
def test_an_html_figure_copied_alone_still_shows_the_figure(run):
    page = (run/'flow.html').read_text()
    assert '<script src="plotly.min.js">' in page                    # the run folder's own copy, offline
    assert re.search(r'https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js', page)  # else the CDN
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)   # else the picture it carries
    assert m, "no embedded PNG fallback in flow.html"
    assert len(page) < 2_000_000, len(page)                            # plotly.js is not inlined


@needs_browser
def test_markdown_export_of_the_executed_notebook_keeps_its_figures(run):
    from nbconvert import MarkdownExporter
    body, res = MarkdownExporter().from_filename(str(run/'walkthrough.ipynb'))
    pngs = {k: v for k, v in res['outputs'].items() if k.endswith('.png')}
    assert len(pngs) >= 4, sorted(res['outputs'])                      # trajectory, flow, noise, world
    assert len(re.findall(r'!\[png\]\([^)]+\.png\)', body)) == len(pngs)
    import io
    for name, data in pngs.items(): assert ink(Image.open(io.BytesIO(data))) > 0.02, name


def test_the_walkthrough_checks_its_numbers_and_writes_the_world_clip(run):
    m = json.loads((run/'metrics.json').read_text())
    assert len(m['checks']) >= 10 and all(c['ok'] for c in m['checks']), m['checks']
    assert {'world.mp4', 'world.json'} <= {p.name for p in run.iterdir()}
