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


def state_dir() -> Path:
    env = os.environ.get("CLOUDBOX_STATE_DIR")
    if env:
        return Path(env)
    if _root():
        return Path("/var/lib/cloudbox")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")
    return Path(base) / "cloudbox"


def cache_dir() -> Path:
    env = os.environ.get("CLOUDBOX_CACHE_DIR")
    if env:
        return Path(env)
    if _root():
        return Path("/var/cache/cloudbox")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cloudbox"


def run_dir() -> Path:
    env = os.environ.get("CLOUDBOX_RUN_DIR")
    if env:
        return Path(env)
    if _root():
        return Path("/run/cloudbox")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "cloudbox" if xdg else Path(f"/tmp/cloudbox-{os.getuid()}")


def results_db() -> Path:
    return state_dir() / "results.db"


def work_base(chosen: str = "") -> Path:
    """Where runs make their per-run work directories: --work-dir when given, else the state dir's work/."""
    return Path(chosen) if chosen else state_dir() / "work"


def user_profiles_dir() -> Path:
    return state_dir() / "profiles"


def preset_dirs() -> list[Path]:
    """Directories holding shipped presets: the checkout's profiles/, then the installed location
    (or only CLOUDBOX_PRESET_DIR when set)."""
    env = os.environ.get("CLOUDBOX_PRESET_DIR")
    if env:
        return [Path(env)] if Path(env).is_dir() else []
    dirs: list[Path] = []
    root = repo_root()
    if root is not None:
        dirs.append(root / "profiles")
    dirs.append(Path("/usr/share/cloudbox/profiles"))
    return [d for d in dirs if d.is_dir()]


def profile_path() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("CLOUDBOX_PROFILE_PATH", "").split(":") if p]
    return extra + preset_dirs() + [user_profiles_dir()]


def study_dirs() -> list[Path]:
    """Directories holding study files (studies/*.toml): the checkout's studies/, then the installed location
    (or only CLOUDBOX_STUDY_DIR when set)."""
    env = os.environ.get("CLOUDBOX_STUDY_DIR")
    if env:
        return [Path(env)] if Path(env).is_dir() else []
    dirs: list[Path] = []
    root = repo_root()
    if root is not None:
        dirs.append(root / "studies")
    dirs.append(Path("/usr/share/cloudbox/studies"))
    return [d for d in dirs if d.is_dir()]


def guest_image_dir() -> Path:
    """Where appliance/guest/build-guest-image puts vmlinuz, initrd.img and manifest.json."""
    env = os.environ.get("CLOUDBOX_GUEST_IMAGE")
    if env:
        return Path(env)
    installed = Path("/usr/share/cloudbox/guest")
    if installed.joinpath("manifest.json").exists() and repo_root() is None:
        return installed
    return cache_dir() / "guest"
