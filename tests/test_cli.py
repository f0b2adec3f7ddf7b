"End-to-end checks of the `worldlab` command: real papermill runs into temporary output folders."
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLDLAB = Path(sys.executable).parent/'worldlab'


def worldlab(*args, cwd=ROOT):
    return subprocess.run([str(WORLDLAB), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=900)


def only_run(out, name):
    runs = list((out/name).iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def test_main_job_on_the_tiny_preset(tmp_path):
    r = worldlab('run', 'walkthrough', '--preset', 'tiny', '--out', tmp_path, '--quiet')
    assert r.returncode == 0, r.stderr
    d = only_run(tmp_path, 'walkthrough')
    assert str(d) in r.stdout                                    # it says where it wrote
    assert {'walkthrough.ipynb', 'params.json', 'status.json', 'metrics.json', 'noise.mp4',
            'trajectory.html', 'flow.html', 'noise.html'} <= {p.name for p in d.iterdir()}
    params = json.loads((d/'params.json').read_text())
    assert params['preset'] == 'tiny'
    assert (params['parameters']['height'], params['parameters']['width']) == (64, 64)   # from settings.ini [tiny]
    m = json.loads((d/'metrics.json').read_text())
    assert m['segments'] == ['push_in', 'pan_right']             # the default prompt's camera
    assert m['latent_shape'] == [16, 5, 8, 8]                    # 17 frames of 64x64 -> Wan latents
    assert json.loads((d/'status.json').read_text())['ok'] is True


def test_overrides_are_typed_and_checked(tmp_path):
    r = worldlab('run', 'walkthrough', '--preset', 'tiny', '-p', 'num_frames', '9',
                 '-p', 'prompt', 'Camera orbit_left. A tower.', '--out', tmp_path, '--quiet')
    assert r.returncode == 0, r.stderr
    m = json.loads((only_run(tmp_path, 'walkthrough')/'metrics.json').read_text())
    assert m['segments'] == ['orbit_left'] and m['latent_shape'] == [16, 3, 8, 8]
    r = worldlab('run', 'walkthrough', '-p', 'num_frams', '9', '--out', tmp_path)
    assert r.returncode == 2 and 'num_frames' in r.stderr        # the error lists the real parameters
    r = worldlab('run', 'walkthrough', '-p', 'num_frames', 'many', '--out', tmp_path)
    assert r.returncode == 2 and 'declared int' in r.stderr
    r = worldlab('run', 'walkthrough', '--preset', 'wan9', '--out', tmp_path)
    assert r.returncode == 2 and 'tiny' in r.stderr


def test_failed_run_exits_nonzero_and_keeps_the_partial_notebook(tmp_path):
    r = worldlab('run', 'walkthrough', '--preset', 'tiny', '-p', 'num_frames', '10', '--out', tmp_path, '--quiet')
    assert r.returncode == 1
    assert 'not 4k+1' in r.stderr                                # the notebook's own error, with its cell
    d = only_run(tmp_path, 'walkthrough')
    nb = json.loads((d/'walkthrough.ipynb').read_text())
    assert any(o.get('output_type') == 'error' for c in nb['cells'] for o in c.get('outputs', []))
    assert json.loads((d/'status.json').read_text())['ok'] is False


def test_list_and_presets():
    r = worldlab('run', '--list')
    assert r.returncode == 0, r.stderr
    assert 'bench_warp' in r.stdout and 'walkthrough' in r.stdout
    assert 'warp_scale: int = 4' in r.stdout                     # parameters read by papermill
    r = worldlab('presets', 'wan2.1-14b')
    assert r.returncode == 0 and json.loads(r.stdout)['wrap_strength'] == 0.4


def test_readme_is_current():
    assert worldlab('readme', '--check').returncode == 0


def test_scene_pairs_resume_without_redoing_work(tmp_path):
    args = ('run', 'scene_pairs', '-p', 'interventions', 'time_reversal,billboard', '-p', 'prompts', 'Camera pan left.',
            '--out', tmp_path, '--run-id', 'r1', '--quiet')
    assert worldlab(*args).returncode == 0
    d = tmp_path/'scene_pairs'/'r1'
    made = {p: p.stat().st_mtime_ns for p in d.glob('*/*.mp4')}
    assert len(made) == 4                                        # two pairs, clean + intervened each
    r = worldlab(*args)                                          # same run id: everything is already there
    assert r.returncode == 0, r.stderr
    assert {p: p.stat().st_mtime_ns for p in d.glob('*/*.mp4')} == made
    assert len((d/'pairs.csv').read_text().splitlines()) == 3
