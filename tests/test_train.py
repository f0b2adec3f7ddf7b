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


def _dist(out, nproc, mode):
    cmd = ([str(BIN/'torchrun'), '--nproc_per_node', str(nproc)] if nproc > 1 else [sys.executable]) + ['tests/dist_step.py', str(out), mode]
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_two_processes_take_the_same_updates_as_one(tmp_path):
    """Two steps (AdamW state, EMA) on 2 gloo processes, with the DDP rule and with FSDP2 sharding, against 1 process
    on the same global batch; then a single process resumes from the FSDP checkpoint."""
    one, ddp, fsdp = (_dist(tmp_path/f'{m}.pt', n, m.split('1')[0]) for m, n in (('ddp1', 1), ('ddp', 2), ('fsdp', 2)))
    assert (one['world'], ddp['world'], fsdp['world'], fsdp['sharded'], ddp['sharded']) == (1, 2, 2, True, False)
    assert max(v.abs().max() for v in one['trainable'].values()) > 0.001      # the update is not trivially zero
    for other in (ddp, fsdp):
        assert set(other['trainable']) == set(one['trainable'])
        for k in one['trainable']: torch.testing.assert_close(other['trainable'][k], one['trainable'][k], atol=1e-6, rtol=1e-5)
        for a, b in zip(one['metrics'], other['metrics']):
            for col in ('reward_mean', 'policy_loss', 'kl', 'grad_norm'): assert abs(a[col] - b[col]) < 1e-5, (col, a[col], b[col])
        for e1, e2 in zip(one['ema'], other['ema']): torch.testing.assert_close(e2, e1, atol=1e-6, rtol=1e-5)
    from worldlab.policy import WanPolicy
    from worldlab.grpo import Trainer, TrainConfig, channel_mean_reward
    tr = Trainer(WanPolicy.tiny(seed=0), TrainConfig(**{**fsdp['cfg'], 'fsdp': False, 'lora_targets': tuple(fsdp['cfg']['lora_targets'])}),
                 {'red': channel_mean_reward(0)}, ['x'])
    tr.load(tmp_path/'fsdp.pt')
    assert tr.step == 2
    for k, v in tr.state()['trainable'].items(): torch.testing.assert_close(v, fsdp['trainable'][k])


def test_worldlab_train_launches_on_two_processes(tmp_path):
    "The launch command of the docs (torchrun here; accelerate launch on a GPU node) with FSDP sharding, then a resume."
    cmd = [str(BIN/'torchrun'), '--nproc_per_node', '2', '-m', 'worldlab.train', '--preset', 'tiny', '--run-dir', str(tmp_path), '--quiet',
           '-p', 'height', '32', '-p', 'width', '32', '-p', 'num_frames', '5', '-p', 'fsdp', 'true']
    for steps in (1, 2):
        r = subprocess.run(cmd + ['-p', 'steps', str(steps)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    cfg = __import__('json').loads((tmp_path/'config.json').read_text())
    assert (cfg['processes'], cfg['sharded']) == (2, True)
    assert list(metrics(tmp_path).index) == [0, 1]
