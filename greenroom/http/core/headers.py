"""Every X-* header greenroom reads or sends, each name written once: the routes set and read
them by these names, and the OpenAPI document (openapi.py) documents them under them.
CORS exposes every response header (cors.py: `Access-Control-Expose-Headers: *`), these included.
"""

# --- read from requests ---------------------------------------------------------------

STRICT_HEADER = "X-miLLM-Strict"  # true/1: refuse the fields that would be ignored (ledger.strict_mode)
REQUEST_ID_HEADER = "X-Request-ID"  # the request's id: a client's is kept, and every response carries it

# --- miLLM's response headers (the spec's) ----------------------------------------------

IGNORED_FIELDS_HEADER = "X-miLLM-Ignored-Fields"  # the locations of the fields not read (RFC 8941 list)
SEED_HEADER = "X-miLLM-Seed"  # a sent seed echoed, with the scope of its promise
STEERING_HEADER = "X-miLLM-Steering"  # "none" on a scoring request: every SAE hook suppressed
CIRCUIT_RUNG_HEADER = "X-miLLM-Circuit-Rung"  # the rung of a circuit that genuinely steers the answer
CONSTRAINED_HEADER = "X-miLLM-Constrained"  # the structured output decoded under: json_object, or json_schema;name=…
STEERING_INTENSITY_HEADER = "X-miLLM-Steering-Intensity"  # a request's steering dial, resolved to its λ

# --- greenroom's own (beyond the spec) -----------------------------------------------------

DRAWN_SEED_HEADER = "X-Greenroom-Drawn-Seed"  # the seed drawn for a request sent without one: it reproduces it
NOT_STORED_HEADER = "X-Greenroom-Not-Stored"  # why a Responses answer asked to be stored was not
NUM_CTX_HEADER = "X-Greenroom-Num-Ctx"  # Ollama: the context window the request ran with (num_ctx clamped)
DIMENSIONS_HEADER = "X-Greenroom-Dimensions"  # Ollama's /api/embed: the length of the vectors answered
# Ollama: what its rule cut from a prompt longer than its window, an RFC 8941 dictionary
# `messages=<oldest messages dropped>, tokens=<tokens dropped from the prompt's middle>`
TRUNCATED_HEADER = "X-Greenroom-Truncated"

# --- the NPU proxy's (Ollama surface): where the request ran ------------------------------------

DEVICE_HEADER = "X-NPU-Proxy-Device"  # the device that computed: CPU, GPU or NPU
ROUTE_REASON_HEADER = "X-NPU-Proxy-Route-Reason"  # why the router chose that placement
TOKEN_COUNT_HEADER = "X-NPU-Proxy-Token-Count"  # the prompt's token count the router classifies by

# --- standard ---------------------------------------------------------------------------------

NOSNIFF_HEADER = "X-Content-Type-Options"  # the console's files: "nosniff", their type is the one sent
