"""GRPO training end to end: `worldlab run train`, a run killed with SIGKILL and resumed, and two processes (gloo)
taking the same update as one process on the same global batch."""
import os, signal, subprocess, sys, time
from pathlib import Path
import pandas as pd, torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}


def run_train(out, run_id, steps, **popen):
    args = [str(BIN/'worldlab'), 'run', 'train', '--preset', 'tiny', '-p', 'height', '32', '-p', 'width', '32',
            '-p', 'num_frames', '5', '-p', 'steps', str(steps), '--out', str(out), '--run-id', run_id, '--quiet']
    return subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def metrics(d): return pd.read_csv(d/'metrics.csv').drop_duplicates('step', keep='last').set_index('step')


def test_killed_run_resumes_to_the_same_metrics(tmp_path):
    full = run_train(tmp_path, 'full', 4); assert full.wait(timeout=900) == 0, full.stderr.read()
    p = run_train(tmp_path, 'killed', 4, start_new_session=True)
    ck, log = tmp_path/'train'/'killed'/'checkpoint.pt', tmp_path/'train'/'killed'/'metrics.csv'
    t0 = time.time()
    while not (log.exists() and len(log.read_text().splitlines()) >= 3 and ck.exists()):   # 2 steps logged and checkpointed
        assert p.poll() is None and time.time() - t0 < 600, 'the run ended before it could be killed'
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL); p.wait()
    assert len(metrics(tmp_path/'train'/'killed')) < 4                     # it really was interrupted
    again = run_train(tmp_path, 'killed', 4); assert again.wait(timeout=900) == 0, again.stderr.read()
    a, b = metrics(tmp_path/'train'/'full'), metrics(tmp_path/'train'/'killed')
    assert list(a.index) == list(b.index) == [0, 1, 2, 3]
    for col in ('reward_mean', 'policy_loss', 'kl', 'grad_norm'):
        assert (a[col] - b[col]).abs().max() < 1e-6, (col, a[col].tolist(), b[col].tolist())


def test_two_processes_take_the_same_update_as_one(tmp_path):
    one, two = tmp_path/'one.pt', tmp_path/'two.pt'
    r = subprocess.run([sys.executable, 'tests/dist_step.py', str(one)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(BIN/'torchrun'), '--nproc_per_node', '2', 'tests/dist_step.py', str(two)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    a, b = torch.load(one), torch.load(two)
    assert (a['world'], b['world']) == (1, 2)
    assert max(a['lora'][k].abs().max() for k in a['lora']) > 0.01          # the update is not trivially zero
    for k in a['lora']: torch.testing.assert_close(a['lora'][k], b['lora'][k], atol=1e-6, rtol=1e-5)
