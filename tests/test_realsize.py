"""Real-size Wan2.1: the bf16 path keeps diffusers' float32 modules, the configurations build the published sizes,
LoRA targets are checked against the real blocks, and the memory plan's parts follow from independent counts."""
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def dtypes(module):
    return {n: t.dtype for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_floating_point()}


def test_bf16_policy_keeps_the_modules_diffusers_keeps_in_float32():
    "A bf16 policy holds the dtypes diffusers' own loader gives (before the fix, the time embedder became bf16)."
    from diffusers import WanPipeline
    from worldlab.policy import WanPolicy, dtype_kwargs
    pipe = WanPipeline.from_pretrained(ROOT/'data/mini_wan', **dtype_kwargs(torch.bfloat16))
    assert dtypes(pipe.transformer)['condition_embedder.time_embedder.linear_1.weight'] == torch.float32
    loaded = WanPolicy.from_pretrained(ROOT/'data/mini_wan', device='cpu', dtype='bf16').pipe
    built = WanPolicy(WanPipeline.from_pretrained(ROOT/'data/mini_wan'), 'cpu', torch.bfloat16).pipe
    for part in ('transformer', 'text_encoder'):                  # diffusers' and transformers' own loaders
        ref = dtypes(getattr(pipe, part))
        for name, got in (('from_pretrained', dtypes(getattr(loaded, part))), ('cast', dtypes(getattr(built, part)))):
            diff = {k: (ref[k], got.get(k)) for k in ref if got.get(k) != ref[k]}
            assert not diff, f"{part} {name}: {len(diff)} tensors differ from the loader's (loader, policy): {list(diff.items())[:5]}"


def test_velocity_passes_a_float32_timestep_and_lora_trains_in_float32():
    "bf16 holds 999 as 1000: the timestep reaches the transformer as float32, and the adapter's weights are float32."
    from worldlab.policy import WanPolicy, tiny_wan
    pol = WanPolicy(tiny_wan(), 'cpu', torch.bfloat16, max_sequence_length=32)
    seen = []
    pol.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw['timestep']), with_kwargs=True)
    pol.velocity(torch.randn(1, 16, 2, 4, 4), 999.0, pol.encode(['a red house']))
    assert seen[0].dtype == torch.float32 and float(seen[0][0]) == 999.0, seen
    params = pol.add_lora(4, 8)
    assert {p.dtype for p in params} == {torch.float32}, {p.dtype for p in params}


def test_lora_targets_the_real_blocks_lack_are_an_error():
    from worldlab.policy import add_lora_to
    from worldlab.realsize import build_transformer
    with pytest.raises(ValueError, match=r"\['to_x'\] name no linear layer"):
        add_lora_to(build_transformer('1.3b', 'meta'), 8, 16, ('to_q', 'to_x'))


def independent_count(d, f, layers, text_dim=4096, freq=256, cin=16, cout=16, patch=4):
    "Wan2.1's transformer by hand, written out term by term (not realsize's formula)."
    block = (d*d + d)*8 + 2*d*2 + 2*d + (d*f + f) + (f*d + d) + 6*d
    return (cin*patch*d + d) + (freq*d + d) + (d*d + d) + (d*6*d + 6*d) + (text_dim*d + d) + (d*d + d) \
        + layers*block + (d*cout*patch + cout*patch) + 2*d


@pytest.mark.parametrize('size,d,f,layers,published', [('wan2.1-1.3b', 1536, 8960, 30, 1.42e9),
                                                        ('wan2.1-14b', 5120, 13824, 40, 14.29e9)])
def test_the_configurations_build_the_published_sizes(size, d, f, layers, published):
    from worldlab.realsize import build_transformer, lora_param_count, transformer_param_count, wan_config
    tr = build_transformer(size, 'meta')
    n = sum(p.numel() for p in tr.parameters())
    assert n == independent_count(d, f, layers) == sum(transformer_param_count(wan_config(size)).values()), n
    assert round(n/1e7)*1e7 == published, (n, published)        # 1.42 B and 14.29 B
    assert lora_param_count(wan_config(size), 32) == layers*8*32*2*d


def update_grads(**kw):
    "The LoRA gradients of one GRPO update of the tiny twin (CFG on, so the negative prompt is split too)."
    import tempfile
    from worldlab.config import resolve
    from worldlab.train import make_trainer
    with tempfile.TemporaryDirectory() as d:
        tr = make_trainer(resolve('tiny', dict(steps=1, reward_weights={'red': 1.0}, guidance_scale=3.0, **kw)), d)
        tr.opt.step = lambda *a, **k: None                       # keep the gradients, skip the step
        _, prompts = tr.batch_prompts(); mine = [0, 1]; win = tr.window()
        rolls, embs = tr.rollout(prompts, mine, win)
        r, _, _ = tr.score(prompts, mine, rolls)
        st, _ = tr.update(rolls, embs, tr.advantages(r, mine), win)
        return torch.cat([p.grad.flatten() for p in tr.params]), st


@pytest.mark.parametrize('kw', [dict(micro_batch=1), dict(micro_batch=3), dict(gradient_checkpointing=True)])
def test_micro_batches_and_checkpointing_give_the_whole_groups_gradient(kw):
    "The update's gradient is a sum over videos: splitting the group or recomputing activations leaves it unchanged."
    ref, st_ref = update_grads()
    got, st = update_grads(**kw)
    err = float((got - ref).abs().max()/ref.abs().max())
    assert err < 1e-4, f"{kw}: max relative difference {err:.2e} (float32 sums in another order: about 1e-6)"
    assert abs(st[0]['policy_loss'] - st_ref[0]['policy_loss']) < 1e-6, (st, st_ref)


def test_saved_bytes_counts_what_autograd_keeps():
    "Known cases: a linear layer with a frozen weight keeps its input; a product keeps both factors; exp its result."
    from worldlab.memory import saved_bytes
    lin = torch.nn.Linear(64, 32).requires_grad_(False); lin.weight.requires_grad_(True)
    assert saved_bytes(lambda: lin(torch.randn(10, 64)), lin)[0] == 10*64*4
    a, b = torch.randn(100, requires_grad=True), torch.randn(100, requires_grad=True)
    assert saved_bytes(lambda: a*b)[0] == 2*100*4
    assert saved_bytes(lambda: torch.exp(a*2))[0] == 100*4


@pytest.mark.parametrize('size,d,layers', [('wan2.1-1.3b', 1536, 30), ('wan2.1-14b', 5120, 40)])
def test_the_shipped_activation_fit_keeps_block_inputs_under_checkpointing(size, d, layers):
    "With checkpointing a block keeps only its input, N x d values in bf16: the shipped fit's slope is 2d bytes."
    from worldlab.memory import activation_bytes, load_activation_fit
    fit = load_activation_fit()
    sel = fit[(fit['size'] == size) & (fit.kernel == 'flash') & fit.checkpointing & (fit.part == 'block')]
    assert len(sel) == 1 and abs(sel.b.iloc[0] - 2*d) < 1e-6 and abs(sel.c.iloc[0]) < 1e-9, sel
    assert (fit.residual < 1).all(), fit[fit.residual >= 1]
    n = 32760
    full, ck = activation_bytes(fit, size, n), activation_bytes(fit, size, n, checkpointing=True)
    assert ck < full/10, (ck, full)
    assert ck > layers*n*2*d, (ck, layers*n*2*d)          # at least every block's input


def test_memory_plan_parts_follow_from_counts():
    "LoRA state: 5 fp32 copies of the formula's count; rollouts: 2S+1 latents and the video per sample, float32."
    from worldlab.config import resolve
    from worldlab.core import wan_latent_shape
    from worldlab.memory import memory_plan
    from worldlab.realsize import lora_param_count, wan_config
    tc, rc = resolve('wan2.1-1.3b')
    p = memory_plan(tc, rc, gpus=8, card_gib=80).set_index('part').bytes
    assert p.filter(like='LoRA').iloc[0] == 5*4*lora_param_count(wan_config('wan2.1-1.3b'), 32)
    C, T, h, w = wan_latent_shape(81, 480, 832)
    assert p.filter(like='rollouts').iloc[0] == 8*4*(C*T*h*w*(2*50 + 1) + 81*3*480*832)
    tc14, rc14 = resolve('wan2.1-14b')
    p14 = memory_plan(tc14, rc14, gpus=8, card_gib=80).set_index('part').bytes
    one_gpu = memory_plan(tc14, rc14, gpus=1, card_gib=80).set_index('part').bytes
    assert p14.filter(like='LoRA').iloc[0] == one_gpu.filter(like='LoRA').iloc[0]/8     # FSDP splits the state


def test_train_refuses_a_run_that_will_not_fit_before_loading_anything(tmp_path):
    "World-R1's config needs far more than 40 GiB; the error names the settings; a fitting run goes on to load."
    from worldlab.config import resolve
    from worldlab.train import make_trainer
    world_r1 = dict(device='cpu', gpu_gib=40.0, gradient_checkpointing=False, micro_batch=0)   # the release's config
    with pytest.raises(ValueError, match=r'it fits with -p gradient_checkpointing true') as e:
        make_trainer(resolve('wan2.1-1.3b', world_r1), tmp_path)
    assert 'GiB per GPU' in str(e.value) and 'activations' in str(e.value), str(e.value)
    ok = dict(device='cpu', gpu_gib=80.0, gradient_checkpointing=True, micro_batch=1, prompts_per_batch=1)
    with pytest.raises(OSError, match='cannot load a Wan pipeline'):   # past the check: no hub here
        make_trainer(resolve('wan2.1-1.3b', ok), tmp_path)


@pytest.mark.slow
def test_real_size_grpo_steps_resume_exactly(tmp_path):
    "The wan2.1-1.3b preset's code path on the real-size random 1.3B in bf16 (5x64x64): a resume logs the same step."
    import shutil
    from worldlab.config import resolve
    from worldlab.train import make_trainer
    p = resolve('wan2.1-1.3b', dict(model='random:wan2.1-1.3b', device='cpu', num_frames=5, height=64, width=64,
                                    num_steps=2, group_size=2, prompts_per_batch=1, steps=1,
                                    reward_weights={'red': 1.0}))
    tr = make_trainer(p, tmp_path/'a'); tr.fit(1, progress=False)
    (tmp_path/'b').mkdir(); shutil.copy(tmp_path/'a/checkpoint.pt', tmp_path/'b/checkpoint.pt')
    one = tr.fit(2, progress=False)[0]
    again = make_trainer(p, tmp_path/'b').fit(2, progress=False)[0]
    keys = ('reward_mean', 'policy_loss', 'kl', 'grad_norm', 'clip_frac')
    assert all(one[k] == again[k] for k in keys), {k: (one[k], again[k]) for k in keys}
    assert one['kl'] > 0, one                               # the adapter moved in step 0: the reference pass differs


def test_fsdp_keeps_diffusers_float32_modules_in_float32():
    "Under FSDP2 a bf16 policy's time embedder computes in float32 (a bf16 mixed-precision policy cast it too)."
    import json, subprocess, sys
    bin_ = Path(sys.executable).parent
    r = subprocess.run([str(bin_/'torchrun'), '--nproc_per_node', '2', 'tests/dist_fsdp_dtype.py'], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith('RESULT ')]
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(line[0][7:])
    assert res['sharded'] and res['time_embedder'] == ['torch.float32'], res
    assert all(math.isfinite(g) for g in res['grad_norm']), res
