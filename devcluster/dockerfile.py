"""The Dockerfile read as data: its stages and instructions, what its build context holds after .dockerignore,
and which files its COPY lines put where.

The harness builds the product image without docker (devcluster/product_image.py) and tests check what the
image would hold (tests/deploy/test_image_contents.py); both read the recipe from here, so neither can drift
from what `docker build` does. Covers the subset of the syntax a Dockerfile of this project uses (ARG, FROM,
ENV, RUN, COPY, WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD; `$VAR` and `${VAR}`); anything else it reads is an
error naming the line, never a silent guess.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from devcluster.binaries import REPO

DOCKERFILE = REPO / "Dockerfile"
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_SHELL_SEPARATORS = ("&&", ";", "||")
KNOWN = {"ARG", "FROM", "ENV", "RUN", "COPY", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}


class DockerfileError(ValueError):
    pass


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: RUN, COPY, ...
    text: str  # what follows the keyword, continuation lines joined
    line: int  # where it starts in the Dockerfile, 1-based


@dataclass
class Stage:
    name: str
    base: str  # the FROM image, its ARGs expanded
    instructions: list[Instruction] = field(default_factory=list)


@dataclass(frozen=True)
class ImageConfig:
    """What the final stage sets for a container: the OCI image config's fields."""

    env: dict[str, str]
    user: str
    workdir: str
    entrypoint: list[str]
    cmd: list[str]
    exposed_ports: list[str]

    def oci(self) -> dict:
        config: dict = {
            "Env": [f"{key}={value}" for key, value in self.env.items()],
            "Entrypoint": self.entrypoint,
            "Cmd": self.cmd,
            "User": self.user,
            "WorkingDir": self.workdir,
        }
        if self.exposed_ports:
            config["ExposedPorts"] = {port: {} for port in self.exposed_ports}
        return config


def expand(text: str, values: dict[str, str], where: str) -> str:
    """`$NAME` and `${NAME}` replaced from `values`; an unknown name is an error (docker would expand it to
    an empty string, which hides a typo)."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise DockerfileError(f"{where}: ${name} is not set (set: {', '.join(sorted(values)) or 'none'})")
        return values[name]

    return _VARIABLE.sub(value, text)


def instructions(text: str) -> list[Instruction]:
    """Logical instructions: comment lines dropped (inside a continuation too), continued lines joined."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        continues = stripped.endswith("\\")
        pending.append(stripped[:-1].strip() if continues else stripped)
        if continues:
            continue
        keyword, _, rest = " ".join(part for part in pending if part).partition(" ")
        found.append(Instruction(keyword.upper(), rest.strip(), start))
        pending = []
    if pending:
        raise DockerfileError(f"Dockerfile line {start}: a continuation `\\` with no line after it")
    return found


def shell_commands(script: str) -> list[list[str]]:
    """A RUN line's commands, split at `&&`, `;` and `||`, each as its argv."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in _SHELL_SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


class Dockerfile:
    """One Dockerfile: the global ARGs, the stages, and per stage what the recipe runs, copies and sets."""

    def __init__(self, path: Path = DOCKERFILE):
        self.path = Path(path)
        self.global_args: dict[str, str] = {}
        self.stages: list[Stage] = []
        self._stage_args: dict[str, dict[str, str]] = {}
        for ins in instructions(self.path.read_text()):
            where = f"{self.path.name} line {ins.line}"
            if ins.keyword not in KNOWN:
                raise DockerfileError(
                    f"{where}: {ins.keyword} is not read here (read: {', '.join(sorted(KNOWN))})"
                )
            if ins.keyword == "ARG":
                name, has_default, default = ins.text.partition("=")
                if not self.stages:
                    if not has_default:
                        raise DockerfileError(f"{where}: global ARG {name} has no default")
                    self.global_args[name] = default.strip('"')
                else:
                    args = self._stage_args[self.stages[-1].name]
                    args[name] = default.strip('"') if has_default else self.global_args.get(name, "")
                continue
            if ins.keyword == "FROM":
                words = ins.text.split()
                name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(self.stages))
                self.stages.append(Stage(name, expand(words[0], self.global_args, where)))
                self._stage_args[name] = {}
                continue
            if not self.stages:
                raise DockerfileError(f"{where}: {ins.keyword} before the first FROM")
            self.stages[-1].instructions.append(ins)

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise DockerfileError(
            f"{self.path.name}: no stage {name!r} (stages: {[s.name for s in self.stages]})"
        )

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_args(self, stage: Stage) -> dict[str, str]:
        return dict(self._stage_args[stage.name])

    def _where(self, ins: Instruction) -> str:
        return f"{self.path.name} line {ins.line}"

    def run_commands(self, stage: Stage) -> list[list[str]]:
        """Every command the stage's RUN lines run, ARGs expanded (the shell would do it at build time)."""
        found = []
        for ins in stage.instructions:
            if ins.keyword == "RUN":
                found += shell_commands(expand(ins.text, self.stage_args(stage), self._where(ins)))
        return found

    def copies(self, stage: Stage) -> list[tuple[list[str], str, str | None]]:
        """(sources, destination, --from stage or None for the build context) per COPY line."""
        found = []
        for ins in stage.instructions:
            if ins.keyword != "COPY":
                continue
            words = json.loads(ins.text) if ins.text.startswith("[") else shlex.split(ins.text)
            flags = {w[2:].partition("=")[0]: w.partition("=")[2] for w in words if w.startswith("--")}
            paths = [w for w in words if not w.startswith("--")]
            if len(paths) < 2:
                raise DockerfileError(f"{self._where(ins)}: COPY needs a source and a destination")
            if set(flags) - {"from", "chown", "chmod", "link"}:
                raise DockerfileError(
                    f"{self._where(ins)}: COPY flags {sorted(flags)} (read: from, chown, chmod)"
                )
            found.append((paths[:-1], paths[-1], flags.get("from")))
        return found

    def workdir(self, stage: Stage, before_line: int | None = None) -> str:
        workdir = "/"
        for ins in stage.instructions:
            if before_line is not None and ins.line >= before_line:
                break
            if ins.keyword == "WORKDIR":
                workdir = str(PurePosixPath(workdir, ins.text))
        return workdir

    def image_config(self, base_env: dict[str, str], stage: Stage | None = None) -> ImageConfig:
        """The container config the stage leaves: ENV on top of the base image's, USER, WORKDIR, EXPOSE,
        ENTRYPOINT and CMD."""
        stage = stage or self.final
        env = dict(base_env)
        user = ""
        entrypoint: list[str] = []
        cmd: list[str] = []
        ports: list[str] = []
        for ins in stage.instructions:
            where = self._where(ins)
            if ins.keyword == "ENV":
                before = {**self.stage_args(stage), **env}
                words = shlex.split(ins.text)
                pairs = [w.partition("=") for w in words]
                if not all(sep for _, sep, _ in pairs):
                    raise DockerfileError(f"{where}: ENV {ins.text!r}: write it as KEY=value pairs")
                env.update({key: expand(value, before, where) for key, _, value in pairs})
            elif ins.keyword == "USER":
                user = expand(ins.text, {**self.stage_args(stage), **env}, where)
            elif ins.keyword == "EXPOSE":
                ports = [p if "/" in p else f"{p}/tcp" for p in ins.text.split()]
            elif ins.keyword in ("ENTRYPOINT", "CMD"):
                argv = json.loads(ins.text) if ins.text.startswith("[") else ["/bin/sh", "-c", ins.text]
                if ins.keyword == "ENTRYPOINT":
                    entrypoint, cmd = argv, []  # docker: a new ENTRYPOINT resets the CMD set before it
                else:
                    cmd = argv
        return ImageConfig(env, user, self.workdir(stage), entrypoint, cmd, ports)


# ------------------------------------------------------------------ the build context


@dataclass(frozen=True)
class IgnoreRule:
    exception: bool  # a `!pattern` line: brings back what an earlier rule excluded
    pattern: str  # cleaned, slash-separated, no leading slash
    regex: re.Pattern


def _pattern_regex(pattern: str) -> re.Pattern:
    """Docker's translation (moby/patternmatcher): `**` spans directories, `*` and `?` stay within one."""
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*" and pattern[i + 1 : i + 2] == "*":
            i += 2
            if pattern[i : i + 1] == "/":
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif char in "[]-^!":
            out += char
        else:
            out += re.escape(char)
        i += 1
    return re.compile(f"^{out}$")


def ignore_rules(path: Path) -> list[IgnoreRule]:
    rules: list[IgnoreRule] = []
    if not path.exists():
        return rules
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if exception else line).lstrip("/")
        rules.append(IgnoreRule(exception, pattern, _pattern_regex(pattern)))
    return rules


def ignored(relative: str, rules: list[IgnoreRule]) -> bool:
    """Docker's rule: the last matching line wins; a line matches a path or any directory above it."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for rule in rules:
        if rule.exception != excluded:
            continue
        if any(rule.regex.match(candidate) for candidate in candidates):
            excluded = not rule.exception
    return excluded


def _exception_may_match_below(directory: str, rules: list[IgnoreRule]) -> bool:
    """Whether some `!` rule could bring back a path below an excluded directory (else it is not walked)."""
    dir_parts = directory.split("/")
    for rule in rules:
        if not rule.exception:
            continue
        pattern_parts = rule.pattern.split("/")
        for index, part in enumerate(dir_parts):
            if index >= len(pattern_parts) or not fnmatch.fnmatchcase(part, pattern_parts[index]):
                break
            if "**" in pattern_parts[index]:
                return True
        else:
            if len(pattern_parts) > len(dir_parts):
                return True
    return False


def context_files(root: Path = REPO) -> list[str]:
    """The files (relative, slash-separated) `docker build root` sends, after root/.dockerignore."""
    rules = ignore_rules(root / ".dockerignore")
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        dirs[:] = sorted(
            d for d in dirs if not ignored(prefix + d, rules) or _exception_may_match_below(prefix + d, rules)
        )
        found += [prefix + f for f in sorted(files) if not ignored(prefix + f, rules)]
    return found


def copied_files(dockerfile: Dockerfile, stage: Stage, root: Path = REPO) -> dict[str, str]:
    """Absolute path in the stage's filesystem -> path in the build context, for every COPY from the context.

    A source the context lacks (excluded by .dockerignore, or absent) is an error, as it is for docker."""
    context = context_files(root)
    placed: dict[str, str] = {}
    for ins, (sources, destination, from_stage) in zip(
        [i for i in stage.instructions if i.keyword == "COPY"], dockerfile.copies(stage), strict=True
    ):
        if from_stage is not None:
            continue
        target = PurePosixPath(dockerfile.workdir(stage, ins.line), destination)
        into_folder = destination.endswith("/") or len(sources) > 1
        for source in sources:
            source = os.path.normpath(source).lstrip("/")
            if any(char in source for char in "*?["):
                matching = _pattern_regex(source)
                files = [f for f in context if matching.match(f)]
                placed.update({str(target / PurePosixPath(f).name): f for f in files})
            elif source in context:
                files = [source]
                placed[str(target / PurePosixPath(source).name if into_folder else target)] = source
            else:
                files = [f for f in context if source == "." or f.startswith(f"{source}/")]
                strip = 0 if source == "." else len(source) + 1
                placed.update({str(target / f[strip:]): f for f in files})
            if not files:
                raise DockerfileError(
                    f"{dockerfile.path.name} line {ins.line}: COPY {source}: not in the build context "
                    f"(absent, or excluded by .dockerignore)"
                )
    return placed
