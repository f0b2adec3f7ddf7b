"`worldlab run generate` end to end (papermill, the CLI), and `python -m worldlab.generate` on two processes."
import json, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SMALL = ['-p', 'num_frames', '5', '-p', 'height', '32', '-p', 'width', '32', '-p', 'num_steps', '2']


def worldlab(*args):
    return subprocess.run([str(BIN/'worldlab'), *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=900)


def only_run(out):
    runs = list((out/'generate').iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def frames(path):
    from worldlab.core import read_video
    return read_video(path)[0]


def test_generate_on_the_tiny_twin_writes_videos_sidecars_index_and_sheet_and_resumes(tmp_path):
    prompt = 'Camera orbit left. A stone tower at dusk.'
    r = worldlab('run', 'generate', '--preset', 'tiny', '-p', 'prompt', prompt, '-p', 'seeds', '0,3', *SMALL,
                 '--out', tmp_path, '--quiet')
    assert r.returncode == 0, r.stderr
    d = only_run(tmp_path)
    assert {'index.csv', 'contact_sheet.png', 'videos', 'metrics.json', 'generate.ipynb'} <= {p.name for p in d.iterdir()}
    assert sorted(p.name for p in (d/'videos').iterdir()) == ['p0000_s0.json', 'p0000_s0.mp4', 'p0000_s3.json',
                                                              'p0000_s3.mp4']
    sc = json.loads((d/'videos/p0000_s3.json').read_text())
    assert (sc['format'], sc['prompt'], sc['seed'], sc['num_frames'], sc['height']) == ('worldlab.video/1', prompt, 3, 5, 32)
    assert sc['camera']['segments'] == ['orbit_left'] and sc['noise']['kind'] == 'warped'
    assert sc['sampling']['num_steps'] == 2 and sc['model']['name'] == 'tiny' and sc['model']['hash'].startswith('sha256:')
    assert frames(d/'videos/p0000_s3.mp4').shape == (5, 32, 32, 3)
    m = json.loads((d/'metrics.json').read_text())
    assert (m['made'], m['kept']) == (2, 0)
    # the same run again: nothing new; one video deleted: only it is made again
    mtime = (d/'videos/p0000_s0.mp4').stat().st_mtime_ns
    (d/'videos/p0000_s3.mp4').unlink()
    r = worldlab('run', 'generate', '--run-id', d.name, '--force', '--out', tmp_path, '--quiet')
    assert r.returncode == 0, r.stderr
    m = json.loads((d/'metrics.json').read_text())
    assert (m['made'], m['kept'], m['videos']) == (1, 1, 2)
    assert (d/'videos/p0000_s0.mp4').stat().st_mtime_ns == mtime


@pytest.mark.parametrize('args,message', [
    (['-p', 'prompts', 'worldlab-v1:valid'], "set 'worldlab-v1' has no split 'valid'"),
    (['-p', 'prompts', 'worldlab-v9:test'], "unknown prompt set 'worldlab-v9'"),
    (['-p', 'injection', 'warp'], "injection = 'warp'"),
    (['-p', 'num_frames', '8'], 'num_frames = 8: the VAE encodes 4k+1 frames; use 5 or 9'),
    (['-p', 'width', '40'], 'width = 40: must be a multiple of 16'),
    (['-p', 'adapters', 'no/such/adapter:0.5'], 'no/such/adapter'),
])
def test_bad_input_fails_before_sampling_naming_the_item(tmp_path, args, message):
    r = worldlab('run', 'generate', '--preset', 'tiny', *args, '--out', tmp_path, '--quiet')
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
    assert not list(tmp_path.rglob('*.mp4'))


def test_an_unreadable_prompt_line_is_named(tmp_path):
    f = tmp_path/'prompts.txt'
    f.write_bytes(b'Camera pan left. A lake.\n\xff a tower\n')
    r = worldlab('run', 'generate', '--preset', 'tiny', '-p', 'prompts', f, '--out', tmp_path/'out', '--quiet')
    assert r.returncode != 0 and 'prompts.txt:2' in r.stderr, r.stderr[-2000:]


TWO = ['-p', 'prompts', 'worldlab-v1:test', '-p', 'limit', '3', '-p', 'seeds', '0,1', *SMALL, '--quiet']
ENV = os.environ | {'OMP_NUM_THREADS': '1'}


def two_processes(run_dir):
    r = subprocess.run([str(BIN/'torchrun'), '--nproc_per_node', '2', '-m', 'worldlab.generate', '--run-dir', run_dir,
                        *TWO], cwd=ROOT, capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_two_processes_make_every_video_once(tmp_path):
    r = two_processes(tmp_path/'two')
    assert r.stdout.count('made 3, kept 0') == 2, r.stdout                   # 6 items: 3 a process
    import pandas as pd
    idx = pd.read_csv(tmp_path/'two/index.csv')                              # rank 0's, after both finished
    assert list(idx.stem) == [f'p{p:04d}_s{s}' for p in range(3) for s in (0, 1)]
    assert len(list((tmp_path/'two/videos').glob('*.mp4'))) == 6 and (tmp_path/'two/contact_sheet.png').exists()


@pytest.mark.slow
def test_two_processes_make_the_videos_one_makes(tmp_path):
    two_processes(tmp_path/'two')
    one = subprocess.run([sys.executable, '-m', 'worldlab.generate', '--run-dir', tmp_path/'one', *TWO], cwd=ROOT,
                         capture_output=True, text=True, timeout=900, env=ENV)
    assert one.returncode == 0, one.stderr[-3000:]
    for f in sorted((tmp_path/'one/videos').glob('*.mp4')):
        assert np.array_equal(frames(tmp_path/'two/videos'/f.name), frames(f)), f.name
