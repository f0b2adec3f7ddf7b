"""Two GRPO steps of a bf16 tiny Wan sharded by FSDP2 over 2 processes; prints the dtype the time embedder (one of
diffusers' float32 modules) computes in. test_realsize.py runs it under torchrun."""
import json, torch
from worldlab.policy import WanPolicy, tiny_wan
from worldlab.grpo import Trainer, TrainConfig, channel_mean_reward

cfg = TrainConfig(height=32, width=32, num_frames=5, num_steps=4, group_size=3, prompts_per_batch=2, lora_rank=4,
                  lora_alpha=8, reward_weights={'red': 1.0}, seed=7, fsdp=True)
pol = WanPolicy(tiny_wan(seed=0), 'cpu', torch.bfloat16, max_sequence_length=32)
seen = set()
pol.transformer.condition_embedder.time_embedder.linear_1.register_forward_hook(
    lambda m, a, o: seen.add(str(o.dtype)) or None)
tr = Trainer(pol, cfg, {'red': channel_mean_reward(0)}, ['camera pan left a red house', 'camera push in a lake at dawn'])
m = [tr.train_step() for _ in range(2)]
if tr.acc.is_main_process:
    print('RESULT ' + json.dumps(dict(sharded=tr.sharded, time_embedder=sorted(seen), grad_norm=[x['grad_norm'] for x in m])))
