#pragma once
// Unicode helpers of the tokenizer, all answered by ICU: UTF-8 iteration, general categories,
// normal forms, case mapping, and the character classes of BERT's normaliser and pre-tokeniser.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wick::tok {

/// The code point at s[i] (valid UTF-8 assumed), advancing i past it.
char32_t next_code_point(std::string_view s, size_t& i);
/// Appends cp as UTF-8.
void append_utf8(std::string& out, char32_t cp);
/// Number of code points in valid UTF-8.
size_t count_code_points(std::string_view s);
/// True when s is valid UTF-8.
bool is_valid_utf8(std::string_view s);
/// s with each ill-formed sequence (maximal subpart) replaced by U+FFFD, as Rust's
/// String::from_utf8_lossy and Python's errors="replace" do.
std::string to_valid_utf8(std::string_view s);
/// True when every byte is ASCII.
bool is_ascii(std::string_view s);

/// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s).
bool is_whitespace(char32_t cp);
/// General category N* (Rust's char::is_numeric).
bool is_numeric(char32_t cp);
/// Letters and numbers (Rust's char::is_alphanumeric).
bool is_alphanumeric(char32_t cp);
/// General category P*.
bool is_punctuation(char32_t cp);

// BERT's character classes. Hugging Face answers these from Unicode 8.0 tables (the
// unicode_categories crate), so characters assigned later count as unassigned here too.
/// Cc, Cf, Co or Cs (as of Unicode 8.0), except tab, newline and carriage return.
bool is_bert_control(char32_t cp);
/// ASCII punctuation and symbols, or general category P* (as of Unicode 8.0).
bool is_bert_punctuation(char32_t cp);
/// Mn (as of Unicode 8.0): what strip_accents removes after NFD.
bool is_bert_accent(char32_t cp);
/// The CJK ideograph blocks BERT pads with spaces.
bool is_cjk_ideograph(char32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
/// s in the given normal form (s must be valid UTF-8).
std::string normalize(std::string_view s, NormalForm form);
/// Appends the full lower-case mapping of cp (U+0130 becomes "i\u0307").
void append_lowercase(std::string& out, char32_t cp);

}  // namespace wick::tok
