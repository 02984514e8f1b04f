"""Pulling a Hugging Face repository with huggingface_hub (HF_ENDPOINT respected, as
huggingface_hub reads it): the name a client pulls → a repository, its file listing, and
the download of the files greenroom serves, with per-file progress.

The token is always explicit: the caller's, or `False` — never huggingface_hub's ambient
credentials (HF_TOKEN, the stored login), which belong to the server's operator, not to
whoever sends a pull. Every Hub call is made with the caller's token, and a refusal is
the caller's error: a private repository is never answered from files already on disk
(huggingface_hub itself falls back to them when the Hub refuses). No message carries a
token or an exception's text (which could quote a request).

Blocking (httpx underneath): call from a worker thread.
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path

import attrs

from greenroom.errors import GreenroomError
from greenroom.store import catalogue

_PREFIXES = re.compile(r"^(https?://)?(hf\.co|huggingface\.co)/", re.IGNORECASE)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# what the transformers engine reads from a checkpoint directory
_CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".jinja", ".model", ".txt", ".tiktoken")
TOKEN_HINT = "send a Hugging Face token in the body's huggingface_token field or as Authorization: Bearer <token>"


@attrs.frozen
class Target:
    name: str  # the name the model is served as (GGUF files add :QUANT)
    repo: str
    quant: str | None  # GGUF: only the files of this quantization


@attrs.frozen
class RepoFile:
    name: str
    size: int
    digest: str  # "sha256:…" (LFS files), else the git blob id as "sha1:…"


@attrs.frozen
class Listing:
    repo: str
    revision: str  # the commit the files come from
    engine: str  # transformers | llama.cpp
    files: tuple[RepoFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


def target(name) -> Target:
    """What an Ollama pull name means: a catalogue alias, or a repository id (`owner/name`,
    optionally as `hf.co/owner/name`), each optionally `:TAG` — `latest`, or the GGUF
    quantization to pull."""
    if name is None or name == "":
        raise GreenroomError("missing_parameter", "'model' is required: the model to pull", "model")
    if not isinstance(name, str):
        raise GreenroomError("invalid_parameter", "'model' must be a string", "model")
    bare = _PREFIXES.sub("", name)
    head, _, tag = bare.rpartition(":") if ":" in bare.rpartition("/")[2] else (bare, "", "")
    if tag and not _TAG.fullmatch(tag):
        raise GreenroomError("invalid_parameter", f"'{name}' has an invalid tag", "model")
    quant = None if tag.lower() in ("", "latest") else tag
    known = catalogue.BY_ALIAS.get(head)
    if known is not None:
        return Target(head, known.repo, quant or known.quant)
    if _REPO_ID.fullmatch(head) and ".." not in head:
        return Target(head, head, quant)
    raise GreenroomError(
        "model_not_found",
        f"'{name}' is neither a known alias (GET /api/models/known) nor a Hugging Face repository id (owner/name)",
        "model",
    )


@contextlib.contextmanager
def _hub_errors(repo: str, token: str | None):
    """huggingface_hub's failures → greenroom's typed errors, worded without the exception
    text."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        yield
    except RepositoryNotFoundError:  # gated repositories included
        if token is None:
            raise GreenroomError(
                "hub_auth_required",
                f"the Hugging Face Hub has no public repository '{repo}': if it is private or gated, {TOKEN_HINT}",
                "model",
            ) from None
        raise GreenroomError(
            "hub_access_denied",
            f"the Hugging Face Hub refused repository '{repo}' with the token "
            "sent: the repository does not exist or the token has no access to it",
            "model",
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403) and token is not None:
            raise GreenroomError(
                "hub_access_denied",
                f"the Hugging Face Hub refused the token sent for '{repo}' (HTTP {status})",
                "model",
            ) from None
        if status in (401, 403):
            raise GreenroomError(
                "hub_auth_required", f"the Hugging Face Hub requires a token for '{repo}': {TOKEN_HINT}", "model"
            ) from None
        raise GreenroomError(
            "hub_unavailable", f"the Hugging Face Hub answered HTTP {status} for '{repo}'", "model"
        ) from None
    except httpx2.TransportError as exc:
        raise GreenroomError(
            "hub_unavailable", f"the Hugging Face Hub could not be reached ({type(exc).__name__})", "model"
        ) from None


def listing(t: Target, token: str | None) -> Listing:
    """The repository's files greenroom would download: its GGUF files (of `t.quant` when
    set), else a checkpoint's top-level config, tokenizer and safetensors files."""
    from huggingface_hub import HfApi

    with _hub_errors(t.repo, token):
        info = HfApi(token=token or False).model_info(t.repo, files_metadata=True)
    siblings = info.siblings or []
    files = [
        RepoFile(s.rfilename, s.size or 0, f"sha256:{s.lfs.sha256}" if s.lfs else f"sha1:{s.blob_id}") for s in siblings
    ]
    ggufs = [f for f in files if f.name.endswith(".gguf")]
    if ggufs:
        chosen = [f for f in ggufs if t.quant is None or t.quant.upper() in f.name.upper()]
        if not chosen:
            raise GreenroomError(
                "model_not_found", f"repository '{t.repo}' has no GGUF file of quantization '{t.quant}'", "model"
            )
        return Listing(t.repo, info.sha, "llama.cpp", tuple(chosen))
    names = {f.name for f in files}
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        if t.quant is not None:
            raise GreenroomError(
                "invalid_parameter",
                f"repository '{t.repo}' holds a safetensors checkpoint: a tag "
                f"(':{t.quant}') only chooses among GGUF files",
                "model",
            )
        top = tuple(f for f in files if "/" not in f.name and f.name.endswith(_CHECKPOINT_SUFFIXES))
        return Listing(t.repo, info.sha, "transformers", top)
    raise GreenroomError(
        "unsupported_repository",
        f"repository '{t.repo}' holds neither GGUF files nor a "
        "safetensors checkpoint (config.json and *.safetensors): greenroom cannot serve it",
        "model",
    )


class PullCancelled(Exception):
    """Raised inside the download when the pull's request went away."""


class Progress:
    """Bytes done per file, written by the download thread and read by the stream."""

    def __init__(self):
        self.done: dict[str, int] = {}
        self.cancelled = threading.Event()

    def bar(self, name: str):
        """A tqdm stand-in for huggingface_hub that counts `name`'s bytes (and stops the
        download once the pull is cancelled)."""
        progress = self

        class Bar:
            def __init__(self, *args, initial: int = 0, **kwargs):
                progress.done[name] = initial or 0

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def update(self, n: int | float | None = 1) -> None:
                if progress.cancelled.is_set():
                    raise PullCancelled
                progress.done[name] = progress.done.get(name, 0) + int(n or 0)

            def close(self) -> None:
                pass

        return Bar


def download(lst: Listing, dest: Path, token: str | None, progress: Progress) -> None:
    """Download the listing's files into `dest` (files already there at the same commit
    are kept; an interrupted file resumes)."""
    from huggingface_hub import hf_hub_download

    dest.mkdir(parents=True, exist_ok=True)
    for f in lst.files:
        with _hub_errors(lst.repo, token):
            hf_hub_download(
                lst.repo,
                f.name,
                revision=lst.revision,
                local_dir=dest,
                token=token or False,
                tqdm_class=progress.bar(f.name),
            )
        progress.done[f.name] = f.size
