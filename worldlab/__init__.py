"""Camera-controlled, 3D-consistent video generation: World-R1 (noise warping, 3D-aware rewards, Flow-GRPO) and WorldReward VLM judging, notebook-first."""

__version__ = "0.0.1"
