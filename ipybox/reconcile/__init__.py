"""Keeping a running workspace in step with its `ipybox.toml`: watching it, regenerating tool packages,
and applying each change with the least it takes."""
