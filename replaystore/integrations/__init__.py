"""The store as other libraries' replay buffer: ``replaystore.integrations.sb3`` (Stable-Baselines3).

Nothing here is imported by ``import replaystore``; each integration imports its library only when
its buffer class is first used.
"""
