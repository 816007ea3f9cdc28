"""Armed triggers: instrumentation that outlives the request that set it up (``arm``).

A trigger watches the target for one event (an out-of-memory, the first non-finite gradient, a
hang, a slow step) and, when it happens, writes an evidence directory atomically. Triggers
belong to the agent (``AgentState``), not to a connection: the CLI that armed them may exit or
be killed; ``disarm`` and ``detach`` remove them.

Modules:
  evidence.py    the output directory, held by descriptor; one directory per event, written
                 under a temporary name and renamed whole; the disk cap
  step_clock.py  the step: torch's global optimizer step hooks (or a method the user names),
                 installed and removed only where no thread is iterating torch's hook tables
  hang.py, nan.py, oom.py, slow.py   one trigger each
  capture.py     what several triggers capture: stacks, the program's frame, a census
  armory.py      the triggers of one agent, their watcher thread, arm/disarm/describe
"""
