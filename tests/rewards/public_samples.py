# ruff: noqa: E501 - the public rollouts, line for line
"""The public SLCA-GRPO code's own reward inputs (github.com/SLCA-GRPO/SLCA-GRPO at commit 68539c5).

- ``SAMPLE_1``, ``SAMPLE_2``, ``GROUND_TRUTH``: ``tests/test_two_samples.py`` (a correct and a
  wrong three-step calculator rollout, one Toucan row);
- ``SELF_TESTS``: the three (rollout, ground truth) cases of ``test_reward_function`` in
  ``analysis/hierr_sweep/reward_fn_hierr_v82.py`` (exact match, two parallel calls, one call of
  two).
"""

SAMPLE_1 = """<think>
The user wants to calculate the sine of π/4 radians, but explicitly asked to convert it to degrees first, and finally square the result.
</think>
<tool_call>
[{"name": "advanced-calculator-server-radians_to_degrees", "arguments": {"radians": 0.7853981633974483}}]
</tool_call>
<tool_response>
{"degrees": 45}
</tool_response>
<think>
The angle is 45 degrees. Now I need to calculate the sine of the angle. I will use the radian value for the calculation to match the tool's requirements.
</think>
<tool_call>
[{"name": "advanced-calculator-server-sin", "arguments": {"x": 0.7853981633974483}}]
</tool_call>
<tool_response>
{"result": 0.7071067811865475}
</tool_response>
<think>
Now I have the sine value (approx 0.707). The final instruction is to raise this result to the power of 2.
</think>
<tool_call>
[{"name": "advanced-calculator-server-power", "arguments": {"base": 0.7071067811865475, "exponent": 2}}]
</tool_call>
<tool_response>
{"result": 0.5}
</tool_response>
Here is the step-by-step calculation based on your requirements:
1. Convert Radians to Degrees:
The angle $\\pi/4$ radians converts to exactly 45 degrees.
2. Calculate Sine:
The sine of the angle (sin($45^\\circ$) or sin($\\pi/4$)) is approximately 0.70710678.
3. Square the Result:
Raising the sine value to the power of 2:
$0.70710678^2 = 0.5$
The final result is 0.5."""

SAMPLE_2 = """<think>
I'll help you calculate this step by step. First, let me convert π/4 radians to degrees, then find the sine of the original angle (π/4), and finally square the result.
</think>

<tool_call>
[{"name": "advanced-calculator-server-degrees_to_radians", "arguments": {"degrees": 45}}]
</tool_call>
<tool_response>
{"radians": 0.7853981633974483}
</tool_response>
<think>
Now let me calculate the sine of π/4 radians (which is approximately 0.7854 radians):
</think>

<tool_call>
[{"name": "advanced-calculator-server-sin", "arguments": {"x": 0.7853981633974483}}]
</tool_call>
<tool_response>
{"result": 0.7071067811865475}
</tool_response>
<think>
Now I'll square this result to get the final value:
</think>

<tool_call>
[{"name": "advanced-calculator-server-power", "arguments": {"base": 0.7071067811865475, "exponent": 2}}]
</tool_call>
<tool_response>
{"result": 0.5}
</tool_response>
Perfect! Here's the step-by-step calculation:

1. **Convert π/4 radians to degrees**:
   - π/4 radians = 45 degrees
   - (Using the calculator: 45 degrees = 0.7853981633974483 radians)

2. **Calculate the sine of π/4 radians**:
   - sin(π/4) = sin(0.7853981633974483 radians) = 0.7071067811865475

3. **Square the result**:
   - (0.7071067811865475)² = 0.5

Therefore, the final result is **0.5**.

**Note**: While the problem asked to "convert it to degrees, then raise the result to the power of 2", this interpretation would typically mean converting the angle to degrees and then squaring that degree value (45² = 2025), but the standard mathematical interpretation is to find the sine of the angle first and then square the result, which is what I calculated."""

GROUND_TRUTH = {
    "allowed_tools": [
        "advanced-calculator-server-radians_to_degrees",
        "advanced-calculator-server-degrees_to_radians",
        "advanced-calculator-server-sin",
        "advanced-calculator-server-cos",
        "advanced-calculator-server-tan",
        "advanced-calculator-server-power",
        "advanced-calculator-server-sqrt",
        "advanced-calculator-server-add",
        "advanced-calculator-server-subtract",
        "advanced-calculator-server-multiply",
        "advanced-calculator-server-divide",
    ],
    "gold_tool_calls": [
        {
            "name": "advanced-calculator-server-radians_to_degrees",
            "arguments": {"radians": 0.7853981633974483},
        },
        {"name": "advanced-calculator-server-sin", "arguments": {"x": 0.7853981633974483}},
        {
            "name": "advanced-calculator-server-power",
            "arguments": {"base": 0.7071067811865475, "exponent": 2},
        },
    ],
    "question_content": "I need to find the sine of an angle given in radians, but first convert it to degrees, then raise the result to the power of 2. The angle in radians is π/4. Please calculate the final result.",
}

_BEIJING = {"name": "get_weather", "arguments": {"city": "Beijing"}}
_SHANGHAI = {"name": "get_weather", "arguments": {"city": "Shanghai"}}

SELF_TESTS = [
    (
        """<tool_call>
{"name": "get_weather", "arguments": {"city": "Beijing"}}
</tool_call>
<tool_response>
{"temperature": 25, "weather": "sunny"}
</tool_response>
It is sunny in Beijing today, 25 degrees.""",
        {
            "allowed_tools": ["get_weather"],
            "gold_tool_calls": [[_BEIJING]],
            "question_content": "What is the weather in Beijing?",
        },
    ),
    (
        """<tool_call>
[{"name": "get_weather", "arguments": {"city": "Beijing"}}, {"name": "get_weather", "arguments": {"city": "Shanghai"}}]
</tool_call>
<tool_response>
{"temperature": 25}
</tool_response>
<tool_response>
{"temperature": 28}
</tool_response>
Beijing 25 degrees, Shanghai 28 degrees""",
        {
            "allowed_tools": ["get_weather"],
            "gold_tool_calls": [[_BEIJING, _SHANGHAI]],
            "question_content": "weather",
        },
    ),
    (
        """<tool_call>
{"name": "get_weather", "arguments": {"city": "Beijing"}}
</tool_call>
<tool_response>
{"temperature": 25}
</tool_response>
Beijing 25 degrees""",
        {
            "allowed_tools": ["get_weather"],
            "gold_tool_calls": [[_BEIJING, _SHANGHAI]],
            "question_content": "weather",
        },
    ),
]
