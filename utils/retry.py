"""When a failed request to the model is tried again, and after how long.

PocketFlow retries a node's `exec` after the node's `wait`. A request is tried again only when its failure
may pass and the step has sent nothing yet (a retry after a chunk would send it twice); and the wait
doubles after each failure but the first: a backoff.
"""

from dataclasses import dataclass

from pocketchat.errors import ProviderError


@dataclass
class Backoff:
    wait: float  # seconds before the next attempt
    failures: int = 0

    def retry(self, error: ProviderError, sent_nothing: bool) -> bool:
        """Whether to try again after `error`; if so, `wait` is the wait before it."""
        if not (error.retryable and sent_nothing):
            return False
        if self.failures:
            self.wait *= 2
        self.failures += 1
        return True
