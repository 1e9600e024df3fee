"""What pdserve is pinned to: versions, and the names those versions accept.

The parser names are those sglang 0.5.23 registers (its dependency-free lists
`sglang.srt.parser.reasoning_parser_names` and `sglang.srt.function_call.parser_names`). pdserve keeps
its own copy so `pdserve check` works without SGLang installed; a test compares the copy with the
installed sglang whenever it is importable, so a drift shows up in CI rather than at launch.
"""

SGLANG_VERSION = "0.5.23"
# The PD router: smg ("Shepherd Model Gateway"), where SGLang's router went after sglang-router 0.3.2, its
# last PyPI release. The distribution is installed as `smg` and imported as `smg` (`python -m smg.launch_router`).
ROUTER_DISTRIBUTION = "smg"
ROUTER_VERSION = "1.13.0"
NIXL_VERSION = "1.5.1"

REASONING_PARSERS = frozenset(
    {
        "apertus2509", "beam", "cohere_command4", "deepseek-r1", "deepseek-v3", "deepseek-v4",
        "deepseek-v41", "dots", "gemma4", "gigachat35", "glm45", "gpt-oss", "granite_thinking_parser",
        "hunyuan", "inkling", "interns1", "iquest_q1", "k2_horizon", "kimi", "kimi_k2", "kimi_k3",
        "ling3", "mimo", "minimax", "minimax-append-think", "minimax-m3", "mistral", "muse",
        "nanbeige", "nemotron_3", "poolside_v1", "qwen3", "qwen3-thinking", "response_template",
        "step3", "step3p5",
    }
)

TOOL_CALL_PARSERS = frozenset(
    {
        "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32",
        "deepseekv4", "deepseekv41", "dots", "gemma4", "gigachat3", "gigachat35", "glm", "glm45",
        "glm47", "gpt-oss", "hermes", "hunyuan", "inkling", "interns1", "iquest_q1", "k2_horizon",
        "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3", "mimo", "minicpm5", "minimax-m2",
        "minimax-m3", "mistral", "muse", "nanbeige", "poolside_v1", "pythonic", "qwen", "qwen25",
        "qwen3_coder", "response_template", "spark25", "step3", "step3p5", "trinity",
    }
)
