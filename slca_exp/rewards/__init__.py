"""HierR rewards: tool-call parsing, the tool process reward, the summary reward, routing.

Pure functions over decoded text and the row's ground truth; the only I/O (the judge) sits behind
the :class:`~slca_exp.judges.base.Judge` protocol that :func:`summary_reward` receives.
"""

from slca_exp.rewards.gold import Gold, GroundTruthError, read_gold
from slca_exp.rewards.hierr import HierRWeights, ToolReward, tool_process_reward
from slca_exp.rewards.routing import RoutedScores, reward_stats, route_batch, route_penalty
from slca_exp.rewards.scorer import HierRReward, RewardBatch
from slca_exp.rewards.summary import SummaryReward, summary_reward, summary_rewards
from slca_exp.rewards.toolcalls import ParsedCalls, final_reply, parse_tool_calls, tool_responses
from slca_exp.rewards.types import ToolCall

__all__ = [
    "Gold",
    "GroundTruthError",
    "HierRReward",
    "HierRWeights",
    "ParsedCalls",
    "RewardBatch",
    "RoutedScores",
    "SummaryReward",
    "ToolCall",
    "ToolReward",
    "final_reply",
    "parse_tool_calls",
    "read_gold",
    "reward_stats",
    "route_batch",
    "route_penalty",
    "summary_reward",
    "summary_rewards",
    "tool_process_reward",
    "tool_responses",
]
