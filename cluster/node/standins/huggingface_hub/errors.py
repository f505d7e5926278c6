"""The Hub client's errors the stand-in raises, under the library's names
(https://huggingface.co/docs/huggingface_hub/package_reference/utilities#huggingface_hub.errors.GatedRepoError)."""


class RepositoryNotFoundError(Exception):
    """The repository does not exist, or is private and the token cannot see it."""


class GatedRepoError(RepositoryNotFoundError):
    """The repository is gated and the request was not authenticated for it."""


class LocalEntryNotFoundError(FileNotFoundError):
    """Offline (HF_HUB_OFFLINE, or local_files_only=True) and the cache has no snapshot of the
    revision (huggingface_hub.errors.LocalEntryNotFoundError, an EntryNotFoundError and a
    FileNotFoundError in the library)."""


class OfflineModeIsEnabled(ConnectionError):
    """A request to the Hub while HF_HUB_OFFLINE is set (huggingface_hub.errors.OfflineModeIsEnabled)."""
