"""The search-think agent: protocol, generation backends, the rollout engine, RDRA, STIE, NLR and every method."""
from kunlunlab.agent.backends import SamplingConfig, Segment
from kunlunlab.agent.methods import METHODS, MethodConfig, make_method
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.agent.protocol import Turn, build_messages, extract_boxed, format_results, parse_turn
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine, Trajectory
from kunlunlab.agent.stie import STIEConfig, STIEController, replay
from kunlunlab.agent.transformers_backend import TransformersBackend

__all__ = ["METHODS", "MethodConfig", "OpenAIBackend", "RolloutConfig", "RolloutEngine", "STIEConfig",
           "STIEController", "SamplingConfig", "Segment", "TransformersBackend", "Trajectory", "Turn",
           "build_messages", "extract_boxed", "format_results", "make_method", "parse_turn", "replay"]
