"""Camera-controlled, 3D-consistent video generation: World-R1 (noise warping, 3D-aware rewards, Flow-GRPO) and WorldReward VLM judging, notebook-first.

Modules:

- `worldlab.camera`: Camera trajectories for World-R1 and WorldReward: the 11 motion primitives, chains read from prompt keywords, and action tokens, all in one camera model.
- `worldlab.core`: The plumbing every worldlab module shares: where the project lives, named run presets, seeding, device and dtype, video files, and run folders.
- `worldlab.flow`: Optical flow between camera poses through a fronto-parallel reference plane: the implicit camera signal that noise warping carries into the video model.
- `worldlab.runs`: `worldlab run NAME`: execute a parameterised run notebook with papermill into its own run folder, with presets from `settings.ini` and `-p key value` overrides.
- `worldlab.warp`: Noise warping: camera motion carried into the initial noise of a video model, frame by frame, without changing the noise's distribution. The implicit camera conditioning of World-R1."""

__version__ = "0.0.1"
