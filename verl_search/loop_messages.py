"""The text ``search_r1_agent`` adds to a trajectory besides search results: never the model's own writing.

A leaf shared by the loop, which adds these texts with mask 0, and the reward, which must not read the tags they
quote (``<search>``, ``<answer>``) as the model's actions. Invariant: outside ``<information>`` blocks the loop adds
only these texts, or a ``final_turn_instruction`` of the agent-loop YAML, which it lists under ``LOOP_MESSAGES_KEY``.
"""

#: Search-R1's fixed protocol text for a turn with neither a search nor an answer (search_r1/llm_agent/generation.py)
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
#: added before the last turn unless the agent-loop YAML sets ``final_turn_instruction``
FINAL_TURN_INSTRUCTION = (
    "\nI have used all my searches. I must now give the final answer between <answer> and </answer>.\n"
)
#: the trajectory's ``extra_fields`` key (the reward's ``extra_info``) listing the messages the loop added
LOOP_MESSAGES_KEY = "loop_messages"
#: what the loop says with no agent-loop YAML: the reward removes these even when ``extra_info`` lists nothing
DEFAULT_LOOP_MESSAGES = (INVALID_ACTION_MESSAGE, FINAL_TURN_INSTRUCTION)
