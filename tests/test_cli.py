"End-to-end checks of the `worldlab` command: real papermill runs into temporary output folders."
import json, os, signal, subprocess, sys, time
from dataclasses import fields
from pathlib import Path
import nbformat

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORLDLAB = BIN/'worldlab'


def worldlab(*args, cwd=ROOT, prog=WORLDLAB):
    return subprocess.run([str(prog), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=900)


def run_notebook(nbs, name, body):
    "A run notebook `nbs/runs/NAME.ipynb` that declares `run_dir` and then runs `body`."
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('run_dir: str = ""'); p.metadata['tags'] = ['parameters']
    nb.cells = [p, nbformat.v4.new_code_cell(body)]
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    (nbs/'runs').mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, nbs/'runs'/f'{name}.ipynb')


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
    assert params['parameters']['subpixel'] == 4                 # defaults are recorded too, not only preset and -p
    assert params['parameters']['prompt'].startswith('Camera push in, then pan right.')
    mode = lambda p: p.stat().st_mode & 0o777
    assert mode(d/'params.json') == mode(d/'metrics.json') == mode(d/'walkthrough.ipynb'), \
        {p.name: oct(mode(p)) for p in d.iterdir()}               # JSON is written like every other file
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
    r = worldlab('run', 'walkthrough', '--preset', 'tiny', '-p', 'height', '60', '--out', tmp_path, '--quiet')
    assert r.returncode == 1
    assert 'multiples of 8' in r.stderr                          # the notebook's own error, with its cell
    d = only_run(tmp_path, 'walkthrough')
    nb = json.loads((d/'walkthrough.ipynb').read_text())
    assert any(o.get('output_type') == 'error' for c in nb['cells'] for o in c.get('outputs', []))
    status = json.loads((d/'status.json').read_text())
    assert status['ok'] is False and status['state'] == 'failed'


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
    assert json.loads((d/'status.json').read_text())['state'] == 'done'
    r = worldlab(*args)                                          # a finished run is not silently run again
    assert r.returncode == 2 and 'finished' in r.stderr and '--force' in r.stderr, r.stderr
    r = worldlab(*args, '--force')                               # forced: the notebook runs again, its finished work is kept
    assert r.returncode == 0, r.stderr
    assert {p: p.stat().st_mtime_ns for p in d.glob('*/*.mp4')} == made
    assert len((d/'pairs.csv').read_text().splitlines()) == 3
    r = worldlab(*args[:-1], '-p', 'seed', '1', '--quiet')        # resuming with other values would mix two runs
    assert r.returncode == 2 and 'seed' in r.stderr, r.stderr


def test_an_unfinished_run_resumes_and_a_finished_one_is_refused(tmp_path):
    run_notebook(tmp_path/'nbs', 'twice', 'import pathlib\nmark = pathlib.Path(run_dir, "tried")\n'
                 'if not mark.exists(): mark.write_text(""); raise RuntimeError("first try fails")')
    args = ('run', 'twice', '--nbs', tmp_path/'nbs', '--out', tmp_path/'out', '--run-id', 'r1', '--quiet')
    d = tmp_path/'out'/'twice'/'r1'
    r = worldlab(*args); assert r.returncode == 1 and 'first try fails' in r.stderr, r.stderr
    assert json.loads((d/'status.json').read_text())['state'] == 'failed'
    r = worldlab(*args); assert r.returncode == 0, r.stderr              # unfinished: resumed in its folder
    assert json.loads((d/'status.json').read_text())['state'] == 'done'
    r = worldlab(*args); assert r.returncode == 2 and '--force' in r.stderr


def test_ctrl_c_is_recorded_as_an_interrupted_run_in_one_line(tmp_path):
    run_notebook(tmp_path/'nbs', 'sleepy', 'import pathlib, time\npathlib.Path(run_dir, "started").write_text("")\ntime.sleep(600)')
    p = subprocess.Popen([str(WORLDLAB), 'run', 'sleepy', '--nbs', str(tmp_path/'nbs'), '--out', str(tmp_path/'out'),
                          '--run-id', 'r1', '--quiet'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,
                         # as in a terminal: a shell's background job (`cmd &`, nohup) inherits SIGINT ignored
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    d = tmp_path/'out'/'sleepy'/'r1'
    t0 = time.time()
    while not (d/'started').exists():                            # the kernel is inside the long cell
        assert p.poll() is None and time.time() - t0 < 600, p.communicate()
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)                              # what Ctrl-C in a terminal sends
    out, err = p.communicate(timeout=600)
    assert p.returncode == 130, (out, err)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and 'interrupted in cell 3' in lines[0] and '--run-id r1' in lines[0], err
    status = json.loads((d/'status.json').read_text())
    assert status['state'] == 'interrupted' and status['ok'] is False
    nb = json.loads((d/'sleepy.ipynb').read_text())
    assert nb['metadata']['papermill']['exception'] is True


def test_sigterm_is_recorded_as_an_interrupted_run(tmp_path):
    "A batch scheduler's pre-emption (SLURM sends SIGTERM to the job's processes) or `kill`: recorded, not lost."
    run_notebook(tmp_path/'nbs', 'sleepy', 'import pathlib, time\npathlib.Path(run_dir, "started").write_text("")\ntime.sleep(600)')
    p = subprocess.Popen([str(WORLDLAB), 'run', 'sleepy', '--nbs', str(tmp_path/'nbs'), '--out', str(tmp_path/'out'),
                          '--run-id', 'r1', '--quiet'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    d = tmp_path/'out'/'sleepy'/'r1'
    t0 = time.time()
    while not (d/'started').exists():
        assert p.poll() is None and time.time() - t0 < 600, p.communicate()
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGTERM)                             # the whole group, kernel included, as a scheduler does
    out, err = p.communicate(timeout=600)
    assert p.returncode == 143, (p.returncode, out, err)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and 'terminated (SIGTERM) in cell 3' in lines[0] and '--run-id r1' in lines[0], err
    status = json.loads((d/'status.json').read_text())
    assert status['state'] == 'interrupted' and status['ok'] is False, status
    assert json.loads((d/'sleepy.ipynb').read_text())['metadata']['papermill']['exception'] is True


def test_bad_parameters_are_refused_before_a_run_folder_exists(tmp_path):
    for bad, valid in (('18', 'use 17 or 21'), ('-5', '1, 5, 9, ...')):
        r = worldlab('run', 'walkthrough', '--preset', 'tiny', '-p', 'num_frames', bad, '--out', tmp_path, '--quiet')
        assert r.returncode == 2, r.stderr
        assert f'num_frames = {bad} is not 4k+1' in r.stderr and valid in r.stderr, r.stderr
    r = worldlab('run', 'walkthrough', '-p', 'warp_method', 'nearest', '--out', tmp_path)
    assert r.returncode == 2 and 'anchored, frame_to_frame, discrete' in r.stderr, r.stderr
    assert not (tmp_path/'walkthrough').exists()                 # nothing was created


def heavy_imports(*argv):
    "Exit code of `worldlab ARGV` run in a fresh interpreter, and which heavy modules it imported."
    code = ('import json, sys\nfrom worldlab.runs import main\n'
            'try: rc = main(sys.argv[1:])\nexcept SystemExit as e: rc = e.code\n'
            'print(json.dumps([rc, [m for m in ("torch", "papermill", "nbformat") if m in sys.modules]]))')
    r = subprocess.run([sys.executable, '-c', code, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return json.loads(r.stdout.splitlines()[-1])


def test_help_list_and_argument_errors_do_not_import_torch(tmp_path):
    out = ('--out', tmp_path)
    for argv, rc in ((['--help'], 0), (['run', '--help'], 0), (['run', '--list'], 0), (['presets'], 0),
                     (['run', 'nope', *out], 2), (['run', 'walkthrough', '-p', 'num_frams', '9', *out], 2),
                     (['run', 'walkthrough', '-p', 'num_frames', 'many', *out], 2),
                     (['run', 'walkthrough', '-p', 'num_frames', '18', *out], 2),
                     (['run', 'walkthrough', '--preset', 'wan9', *out], 2)):
        assert heavy_imports(*argv) == [rc, []], argv


def test_relative_paths_are_read_from_the_callers_folder(tmp_path):
    tmp = tmp_path.resolve()
    (tmp/'my').mkdir(); (tmp/'work').mkdir()
    (tmp/'my'/'prompts.txt').write_text("Camera push in. A red barn.\nCamera pan left. A lake.\n\n")  # a trailing blank line
    (tmp/'my'/'empty.txt').write_text('')
    args = ('run', 'train', '--preset', 'tiny', '-p', 'height', '32', '-p', 'width', '32', '-p', 'num_frames', '5',
            '-p', 'steps', '1', '--out', tmp/'out', '--quiet')
    r = worldlab(*args, '-p', 'prompts', '../my/prompts.txt', '--run-id', 'ok', cwd=tmp/'work')
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp/'out'/'train'/'ok'/'config.json').read_text())['prompts']['main'] == 2
    r = worldlab(*args, '-p', 'prompts', '../my/empty.txt', '--run-id', 'empty', cwd=tmp/'work')
    assert r.returncode == 1 and f"{tmp/'my'/'empty.txt'}: no prompts" in r.stderr, r.stderr
    r = worldlab(*args, '-p', 'prompts', '../my/missing.txt', '--run-id', 'missing', cwd=tmp/'work')
    assert r.returncode == 1 and f"no prompt file at {tmp/'my'/'missing.txt'}" in r.stderr, r.stderr


def test_nbdev_test_leaves_the_projects_outputs_alone():
    env = {k: v for k, v in os.environ.items() if k != 'WORLDLAB_OUTPUTS'}   # as the README's command runs
    made = lambda: set((ROOT/'outputs'/'make_prompts').glob('*'))
    before = made()
    r = subprocess.run([str(BIN/'nbdev-test'), 'nbs/runs/make_prompts.ipynb'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert made() == before


def test_reward_and_train_help_show_defaults_names_and_fields():
    r = worldlab('--help', prog=BIN/'worldlab-rewards')
    assert r.returncode == 0, r.stderr
    for name in ('reward_3d', 's_recon', 's_traj', 's_meta', 'reward_general'):   # World-R1's reward names
        assert name in r.stdout, name
    assert 'default: 8765' in r.stdout and 'default: fit' in r.stdout, r.stdout
    from worldlab.config import RunConfig, TrainConfig
    r = worldlab('--help', prog=BIN/'worldlab-train')
    assert r.returncode == 0, r.stderr
    missing = [f.name for f in fields(TrainConfig) + fields(RunConfig) if f.name not in r.stdout]
    assert not missing, missing


def test_ablations_refuse_to_average_runs_that_differ_in_more_than_their_seed(tmp_path):
    runs = tmp_path/'runs'
    for seed, lr in ((0, 3e-4), (1, 3e-3)):              # one preset, two learning rates: not two seeds of one arm
        d = runs/f'full-s{seed}'; d.mkdir(parents=True)
        (d/'status.json').write_text(json.dumps(dict(state='done', ok=True)))
        (d/'metrics.json').write_text(json.dumps(dict(preset='mini', seed=seed, steps=40)))
        (d/'eval.csv').write_text('model,kind,prompt,seed,PSNR\n')
        (d/'params.json').write_text(json.dumps(dict(parameters=dict(overrides={'learning_rate': lr}))))
    r = worldlab('run', 'mini_ablations', '--out', tmp_path/'out', '-p', 'runs', runs, '-p', 'dynamics_pairs', 0,
                 '--quiet')
    assert r.returncode != 0
    said = r.stdout + r.stderr
    assert 'differ in more than their seed' in said and 'full-s0' in said and 'full-s1' in said, said
