"""logging's "flight_profiler.agent" logger, written through the agent's own log (agent_log.py).

Imported only when something may log through ``logging`` (agent_log.use_logging): the triggers
do. The logger never propagates (the target's own handlers may print) and always has this one
handler, which writes through :class:`agent_log.AgentLog` (nowhere when it has no file) and
never reports an error: logging's last-resort handler, stderr, never runs.
"""

from __future__ import annotations

import logging

TYPE_CHECKING = False  # agent_log imports this module (lazily): no cycle at run time
if TYPE_CHECKING:
    from .agent_log import AgentLog

NAME = "flight_profiler.agent"


class AgentLogHandler(logging.Handler):
    """Writes formatted records through an :class:`AgentLog`; says nothing when it cannot."""

    def __init__(self, log: AgentLog) -> None:
        super().__init__()
        self.log = log
        self.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.log.fd is not None:
                self.log.write(self.format(record))
        except BaseException:  # a log line is never worth an error in the target
            pass

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # the default prints to the target's stderr


def bind(log: AgentLog, logger: logging.Logger | None = None) -> logging.Logger:
    """Make ``logger`` (default: the agent's) write through ``log`` alone, from INFO up."""
    logger = logger or logging.getLogger(NAME)
    logger.propagate = False  # never reach the target's own handlers (they may print)
    logger.setLevel(logging.INFO)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.addHandler(AgentLogHandler(log))
    return logger
