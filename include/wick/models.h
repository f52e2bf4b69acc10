#pragma once
// Models and tokenizers: everything under "Models and tokenizers" in docs/API.md.

#include "wick/bert.h"
#include "wick/causal_lm.h"
#include "wick/chat_template.h"
#include "wick/generator.h"
#include "wick/kv_cache.h"
#include "wick/llama.h"
#include "wick/tokenizer.h"
