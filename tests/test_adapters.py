"""Adapters across processes and models: a GRPO checkpoint written by two FSDP2 processes exports to the adapter a
one-process run exports; diffusers' own `load_lora_weights` and PEFT's `PeftModel.from_pretrained` put worldlab's
adapters into mini-Wan with the predictions worldlab's loader gives; a run of `worldlab.train` on two processes
exports its adapters. (The tiny twin's checks and each bad input live in nbs/11d_adapters.ipynb.)"""
import json, os, subprocess, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}
TARGETS = ('to_q', 'to_k', 'to_v', 'to_out.0')


def _dist(out, nproc, mode, warm=None):
    "tests/dist_step.py as tests/test_train.py launches it: two GRPO steps of the tiny twin (or a warm start), a checkpoint."
    cmd = ([str(BIN/'torchrun'), '--nproc_per_node', str(nproc)] if nproc > 1 else [sys.executable]) + ['tests/dist_step.py', str(out), mode]
    cmd += [str(warm)] if warm else []
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _predict(policy, x, prompt='camera push in a red house'):
    with torch.no_grad(): return policy.velocity(x, 500.0, policy.encode([prompt]))


def test_fsdp_checkpoint_exports_the_adapter_of_one_process(tmp_path):
    "Final and EMA weights of a 2-process FSDP2 checkpoint, exported, match a 1-process run's; diffusers loads both alike."
    from worldlab.adapters import export_checkpoint, read_adapter, DIFFUSERS_FILE
    from worldlab.policy import WanPolicy, tiny_wan
    one, fsdp = _dist(tmp_path/'one.pt', 1, 'ddp'), _dist(tmp_path/'fsdp.pt', 2, 'fsdp')
    st = torch.load(fsdp, weights_only=False)
    assert (st['world'], st['sharded']) == (2, True)
    ex = {k: export_checkpoint(p, tmp_path/k) for k, p in (('one', one), ('fsdp', fsdp))}
    assert sorted(ex['one']) == sorted(ex['fsdp']) == ['adapter', 'adapter_ema']
    x = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    for sub in ('adapter', 'adapter_ema'):
        a, b = read_adapter(ex['one'][sub]), read_adapter(ex['fsdp'][sub])
        assert (a.rank, a.alpha, a.modules) == (b.rank, b.alpha, b.modules) == (4, 8, a.modules)
        assert max(v.abs().max() for k, v in a.state.items() if '.lora_B.' in k) > 1e-4     # the adapter moved
        for k in a.state: torch.testing.assert_close(b.state[k], a.state[k], atol=1e-6, rtol=1e-5)
        v = {}
        for k in ('one', 'fsdp'):
            pipe = tiny_wan(seed=0); pipe.load_lora_weights(str(ex[k][sub]/DIFFUSERS_FILE))   # diffusers' own loader
            v[k] = _predict(WanPolicy(pipe, max_sequence_length=32), x)
        torch.testing.assert_close(v['fsdp'], v['one'], atol=1e-5, rtol=1e-4)
        assert (v['one'] - _predict(WanPolicy.tiny(seed=0), x)).abs().max() > 1e-6            # and it is not the base


def test_two_fsdp_processes_warm_start_from_an_adapter(tmp_path):
    "train.warm_start on a transformer sharded over 2 processes: their checkpoint holds the adapter (final and EMA)."
    from worldlab.adapters import export_adapter, read_adapter, read_checkpoint
    from worldlab.policy import WanPolicy
    pol = WanPolicy.tiny(seed=0); pol.add_lora(4, 8, TARGETS)              # dist_step's LoRA: rank 4, alpha 8
    g = torch.Generator().manual_seed(0)
    pol.load_lora_state({k: 0.1*torch.randn(v.shape, generator=g) for k, v in pol.lora_state().items()})
    a = read_adapter(export_adapter(pol, tmp_path/'adapter', 4, 8, TARGETS))
    warm = _dist(tmp_path/'warm.pt', 2, 'fsdp', tmp_path/'adapter')
    assert torch.load(warm, weights_only=False)['sharded'] is True
    for ema in (False, True):
        ck = read_checkpoint(warm, ema)
        assert set(ck.state) == set(a.state) and all(torch.equal(ck.state[k], a.state[k]) for k in a.state)


@pytest.fixture(scope='module')
def mini_adapter(tmp_path_factory):
    "mini-Wan with a rank-4 adapter of random weights (lora_B non-zero), its predictions on and off, and its export."
    from worldlab.adapters import export_adapter
    from worldlab.miniwan import load_mini_wan
    pol = load_mini_wan(); pol.add_lora(4, 8, TARGETS)
    g = torch.Generator().manual_seed(0)
    pol.load_lora_state({k: 0.05*torch.randn(v.shape, generator=g) for k, v in pol.lora_state().items()})
    x = torch.randn(1, *pol.latent_shape(9, 32, 32), generator=g)
    on = _predict(pol, x)
    with pol.reference(): off = _predict(pol, x)
    assert (on - off).abs().max() > 1e-2
    return export_adapter(pol, tmp_path_factory.mktemp('mini')/'adapter', 4, 8, TARGETS, meta={'model': 'miniwan'}), x, on, off


def test_diffusers_loads_a_worldlab_adapter_into_mini_wan(mini_adapter):
    from worldlab.miniwan import load_mini_wan
    folder, x, on, off = mini_adapter
    pol = load_mini_wan(); pol.pipe.load_lora_weights(str(folder))                 # WanPipeline.load_lora_weights
    v = _predict(pol, x)
    torch.testing.assert_close(v, on, atol=1e-5, rtol=1e-4)
    assert (v - off).abs().max() > 1e-2


def test_peft_loads_a_worldlab_adapter_into_mini_wan(mini_adapter):
    from peft import PeftModel
    from worldlab.miniwan import load_mini_wan
    folder, x, on, off = mini_adapter
    pol = load_mini_wan()
    model = PeftModel.from_pretrained(pol.transformer, str(folder))                # PEFT's own loader
    with torch.no_grad():
        v = model(hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=pol.encode(['camera push in a red house']),
                  return_dict=False)[0]
    torch.testing.assert_close(v, on, atol=1e-5, rtol=1e-4)


def test_the_shipped_rl_adapter_loads_alike_in_diffusers_and_worldlab():
    "data/mini_wan_rl through diffusers' loader and through load_rl_adapter; refused by the tiny twin with the shapes named."
    from worldlab.miniwan import load_mini_wan, load_rl_adapter, mini_wan_dir
    from worldlab.adapters import load_adapter
    from worldlab.policy import WanPolicy
    ours = load_rl_adapter(load_mini_wan())
    theirs = load_mini_wan(); theirs.pipe.load_lora_weights(str(mini_wan_dir().parent/'mini_wan_rl'))
    x = torch.randn(1, *ours.latent_shape(9, 32, 32), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_predict(theirs, x), _predict(ours, x), atol=1e-5, rtol=1e-4)
    with ours.reference(): assert (_predict(ours, x) - _predict(theirs, x)).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"mini_wan_rl: blocks\.0\.attn1\.to_k\.lora_A\.weight has shape \(8, \d+\), expected \(8, 32\)"):
        load_adapter(WanPolicy.tiny(seed=0), mini_wan_dir().parent/'mini_wan_rl')


def test_a_two_process_training_run_exports_its_adapters(tmp_path):
    "`torchrun -m worldlab.train` with FSDP2: the main process exports adapter/ and adapter_ema/ from the final checkpoint."
    from worldlab.adapters import read_adapter, read_checkpoint
    cmd = [str(BIN/'torchrun'), '--nproc_per_node', '2', '-m', 'worldlab.train', '--preset', 'tiny', '--run-dir', str(tmp_path), '--quiet',
           '-p', 'height', '32', '-p', 'width', '32', '-p', 'num_frames', '5', '-p', 'fsdp', 'true', '-p', 'steps', '1']
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path/'config.json').read_text())['sharded'] is True
    for sub, ema in (('adapter', False), ('adapter_ema', True)):
        a, ck = read_adapter(tmp_path/sub), read_checkpoint(tmp_path/'checkpoint.pt', ema)
        assert a.format == 'peft' and a.meta['weights'] == ('ema' if ema else 'final') and a.meta['model'] == 'tiny'
        assert all(torch.equal(a.state[k], v) for k, v in ck.state.items())
