"""The agent protocols by name: this project's search-think protocol and the peers' (Search-R1, ReSearch, R1-Searcher),
one module each, and the registry read from the modules.

Every module of this package but ``base`` defines ``PROTOCOL``, an
:class:`~kunlunlab.agent.protocols.base.AgentProtocol` whose fields say what the protocol is; :data:`PROTOCOLS`
collects them when the package is imported (pkgutil), and :func:`register_protocol` adds one defined elsewhere (a
test, a plugin). Every other registry reads this one when it
is used (:class:`RegistryView`, :class:`NamesView`): the methods (``kunlunlab.agent.methods.METHODS``,
``PEER_METHODS``), the agent methods a training run takes (``training.config.AGENT_METHODS``), the reward kinds
(``training.rewards.REWARD_KINDS``) and the peer rewards (``training.peer_rewards.PEER_REWARDS``), so a registered
protocol is in all of them and no registry lists protocols by name (docs/contributing.md, "Adding an agent").
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Callable, Iterator

from kunlunlab.agent.protocols.base import SEARCH_LIMIT_BEHAVIOURS, AgentProtocol
from kunlunlab.agent.protocols.r1_searcher import BEGIN_DOCS, BEGIN_QUERY, END_DOCS, END_QUERY, r1_searcher_checks
from kunlunlab.agent.protocols.research import research_boxed, research_format
from kunlunlab.agent.protocols.search_r1 import SEARCH_R1_INVALID, search_r1_valid_sequence

PROTOCOLS: dict[str, AgentProtocol] = {}  # this project's first, then the peers; register_protocol adds to it


class _LiveView:
    """What both views share: every read goes to ``read()``, the registry's state at that moment."""

    def __init__(self, read: Callable[[], dict | tuple]):
        self._read = read

    def __getitem__(self, key):
        return self._read()[key]

    def __iter__(self) -> Iterator:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __contains__(self, key) -> bool:
        return key in self._read()

    def __repr__(self) -> str:
        return repr(self._read())


class RegistryView(_LiveView, Mapping):
    """A read-only mapping computed from the protocol registry each time it is read (``read()`` -> a dict)."""


class NamesView(_LiveView, Sequence):
    """A tuple of names computed from the protocol registry each time it is read (``read()`` -> a tuple): what a
    config's ``choice(default, names)`` checks a value against, so a registered protocol's names are accepted."""

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None


# the methods that are not a peer protocol's (kunlunlab.agent.methods fills it as it loads): a peer may not take one
RESERVED_METHOD_NAMES: set[str] = set()


def register_protocol(protocol: AgentProtocol) -> AgentProtocol:
    """Adds ``protocol`` to :data:`PROTOCOLS`, and so to every registry that reads it (methods, training config, reward
    kinds, peer rewards). Its name and reward kinds must be new (registering the same object again does nothing)."""
    if not isinstance(protocol, AgentProtocol):
        raise TypeError(f"register_protocol takes an AgentProtocol, got {type(protocol).__name__}")
    known = PROTOCOLS.get(protocol.name)
    if known is protocol:
        return protocol
    if known is not None:
        raise ValueError(f"an agent protocol named {protocol.name!r} is registered already ({known.source})")
    if protocol.peer and protocol.name in RESERVED_METHOD_NAMES:
        raise ValueError(f"a peer protocol's method takes its name, and {protocol.name!r} is a method already "
                         f"({', '.join(sorted(RESERVED_METHOD_NAMES))} are taken)")
    taken = {kind: p.name for p in PROTOCOLS.values() for kind in p.reward_kinds}
    clashes = sorted(f"{kind} ({taken[kind]})" for kind in protocol.reward_kinds if kind in taken)
    if clashes:
        raise ValueError(f"{protocol.name}: reward kinds another protocol defines: {', '.join(clashes)}")
    PROTOCOLS[protocol.name] = protocol
    return protocol


def unregister_protocol(name: str) -> AgentProtocol:
    """Removes the protocol ``name`` from the registry (a test's own protocol, at its end) and returns it."""
    get_protocol(name)
    return PROTOCOLS.pop(name)


@contextmanager
def registered(protocol: AgentProtocol) -> Iterator[AgentProtocol]:
    """``protocol`` in every registry inside the ``with`` block, and in none after it."""
    register_protocol(protocol)
    try:
        yield protocol
    finally:
        if PROTOCOLS.get(protocol.name) is protocol:
            PROTOCOLS.pop(protocol.name)


def get_protocol(name: str) -> AgentProtocol:
    """The protocol called ``name``; a ValueError naming the known ones otherwise."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown agent protocol {name!r}; known: {', '.join(sorted(PROTOCOLS))}") from None


def peer_protocols() -> list[AgentProtocol]:
    """The registered peers' protocols (each its own method), in registry order."""
    return [p for p in PROTOCOLS.values() if p.peer]


def reward_kinds() -> tuple[str, ...]:
    """Every registered protocol's own reward kinds (``AgentProtocol.reward_kinds``), in registry order."""
    return tuple(kind for p in PROTOCOLS.values() for kind in p.reward_kinds)


def reward_owner(kind: str) -> AgentProtocol:
    """The protocol whose reward kind (a reward or a staged kind) ``kind`` is; a ValueError naming the known ones."""
    for p in PROTOCOLS.values():
        if kind in p.reward_kinds:
            return p
    raise ValueError(f"unknown protocol reward {kind!r}; known: {', '.join(sorted(reward_kinds()))}")


def _discover() -> None:
    """Every module of this package but ``base``: its ``PROTOCOL`` registered, this project's first."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        protocol = getattr(module, "PROTOCOL", None)
        if not isinstance(protocol, AgentProtocol):
            raise TypeError(f"{module.__name__} defines no PROTOCOL (an AgentProtocol): every module of "
                            f"{__name__} but base is one protocol")
        found.append(protocol)
    for protocol in sorted(found, key=lambda p: p.peer):  # stable: the peers in module order after this project's
        register_protocol(protocol)


_discover()

__all__ = ["AgentProtocol", "BEGIN_DOCS", "BEGIN_QUERY", "END_DOCS", "END_QUERY", "NamesView", "PROTOCOLS",
           "RegistryView", "SEARCH_LIMIT_BEHAVIOURS", "SEARCH_R1_INVALID", "get_protocol", "peer_protocols",
           "r1_searcher_checks", "register_protocol", "registered", "research_boxed", "research_format",
           "reward_kinds", "reward_owner", "search_r1_valid_sequence", "unregister_protocol"]
