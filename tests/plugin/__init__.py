"""Tests of the Claude Code plugins in `plugins/` and their marketplace, `.claude-plugin/marketplace.json`."""
