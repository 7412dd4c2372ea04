"""Where cloudbox keeps its state, caches and locks (overridable by environment variables).

CLOUDBOX_STATE_DIR  results database, user profiles, run logs   (default /var/lib/cloudbox as root,
                    else $XDG_DATA_HOME/cloudbox)
CLOUDBOX_CACHE_DIR  built guest images, downloaded packages       (default /var/cache/cloudbox as root,
                    else $XDG_CACHE_HOME/cloudbox)
CLOUDBOX_RUN_DIR    run lock, temp backing stores, sockets        (default /run/cloudbox as root,
                    else $XDG_RUNTIME_DIR/cloudbox or /tmp/cloudbox-$UID)
CLOUDBOX_PROFILE_PATH  extra colon-separated directories searched for profiles
CLOUDBOX_PRESET_DIR    the directory of shipped presets, instead of the checkout's profiles/ and
                       /usr/share/cloudbox/profiles (packaging; the TUI's demo data for screenshots)
CLOUDBOX_STUDY_DIR     the directory of study files, instead of the checkout's studies/ and
                       /usr/share/cloudbox/studies
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path


def _root() -> bool:
    return os.geteuid() == 0


@functools.cache
def repo_root() -> Path | None:
    """The source checkout this package runs from (tui/src/cloudbox/core -> repo), if any (fixed for the process:
    profile and study lookups ask for it dozens of times per screen reload)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "profiles").is_dir() and (parent / "tui").is_dir():
            return parent
    return None


def _chosen(env: str, as_root: str, xdg: str, fallback: Callable[[], Path]) -> Path:
    """$`env` when set; else `as_root` for root; else $`xdg`/cloudbox, or `fallback()` when $`xdg` is unset too."""
    chosen = os.environ.get(env)
    if chosen:
        return Path(chosen)
    if _root():
        return Path(as_root)
    base = os.environ.get(xdg)
    return Path(base) / "cloudbox" if base else fallback()


def state_dir() -> Path:
    return _chosen("CLOUDBOX_STATE_DIR", "/var/lib/cloudbox", "XDG_DATA_HOME",
                   lambda: Path.home() / ".local/share/cloudbox")


def cache_dir() -> Path:
    return _chosen("CLOUDBOX_CACHE_DIR", "/var/cache/cloudbox", "XDG_CACHE_HOME",
                   lambda: Path.home() / ".cache/cloudbox")


def run_dir() -> Path:
    return _chosen("CLOUDBOX_RUN_DIR", "/run/cloudbox", "XDG_RUNTIME_DIR",
                   lambda: Path(f"/tmp/cloudbox-{os.getuid()}"))


def results_db() -> Path:
    return state_dir() / "results.db"


def work_base(chosen: str = "") -> Path:
    """Where runs make their per-run work directories: --work-dir when given, else the state dir's work/."""
    return Path(chosen) if chosen else state_dir() / "work"


def user_profiles_dir() -> Path:
    return state_dir() / "profiles"


def _shipped(env: str, folder: str) -> list[Path]:
    """The directories of a kind of shipped file: only $`env` when set, else the checkout's `folder`/ and then the
    installed /usr/share/cloudbox/`folder`, those that exist."""
    chosen = os.environ.get(env)
    if chosen:
        return [Path(chosen)] if Path(chosen).is_dir() else []
    root = repo_root()
    dirs = [root / folder] if root is not None else []
    return [d for d in (*dirs, Path("/usr/share/cloudbox") / folder) if d.is_dir()]


def preset_dirs() -> list[Path]:
    """Directories holding shipped presets: the checkout's profiles/, then the installed location
    (or only CLOUDBOX_PRESET_DIR when set)."""
    return _shipped("CLOUDBOX_PRESET_DIR", "profiles")


def profile_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("CLOUDBOX_PROFILE_PATH", "").split(":") if p]
    return extra + preset_dirs() + [user_profiles_dir()]


def study_dirs() -> list[Path]:
    """Directories holding study files (studies/*.toml): the checkout's studies/, then the installed location
    (or only CLOUDBOX_STUDY_DIR when set)."""
    return _shipped("CLOUDBOX_STUDY_DIR", "studies")


def guest_image_dir() -> Path:
    """Where appliance/guest/build-guest-image puts vmlinuz, initrd.img and manifest.json."""
    env = os.environ.get("CLOUDBOX_GUEST_IMAGE")
    if env:
        return Path(env)
    installed = Path("/usr/share/cloudbox/guest")
    if installed.joinpath("manifest.json").exists() and repo_root() is None:
        return installed
    return cache_dir() / "guest"
