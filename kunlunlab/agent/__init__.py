"""The search-think agent: protocol, generation backends, the rollout engine, RDRA, STIE, NLR and every method."""
from kunlunlab.agent.backends import OpenAIBackend, SamplingConfig, Segment, TransformersBackend
from kunlunlab.agent.methods import METHODS, MethodConfig, make_method
from kunlunlab.agent.protocol import Turn, build_messages, extract_boxed, format_results, parse_turn
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine, Trajectory
from kunlunlab.agent.stie import STIEConfig, STIEController, replay

__all__ = ["METHODS", "MethodConfig", "OpenAIBackend", "RolloutConfig", "RolloutEngine", "STIEConfig",
           "STIEController", "SamplingConfig", "Segment", "TransformersBackend", "Trajectory", "Turn",
           "build_messages", "extract_boxed", "format_results", "make_method", "parse_turn", "replay"]
