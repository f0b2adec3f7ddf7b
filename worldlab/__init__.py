"""Camera-controlled, 3D-consistent video generation: World-R1 (noise warping, 3D-aware rewards, Flow-GRPO) and WorldReward VLM judging, notebook-first.

Modules:

- `worldlab.reward_contract`: What every reward in worldlab is: a function of a batch of videos, their prompts and metas that returns one score per video and per-video details, NaN for a video it could not score (with the reason); how rewards compose from a `{name: weight}` dict; and which failures give NaN and which are bugs that must stop the run."""

__version__ = "0.0.1"
