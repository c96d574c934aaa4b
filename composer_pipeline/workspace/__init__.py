"""An environment that verifies file-tool actions against the workspace the agent had seen.

* :mod:`.files` — the workspace and Claude Code's file-tool rules over it (``Workspace.execute``).
* :mod:`.shell` — what a shell command's output says about the files.
* :mod:`.history` — a session's tool calls in order, and the workspace at each trace state.
* :mod:`.verify` — ``workspace verify``: the prediction beside what really happened, per state.
* :mod:`.env` — the same as an OpenEnv environment (reset / step / state).
"""
