#include "models/tokenizer_unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <vector>

#include "wick/tokenizer.h"

namespace wick::tok {

char32_t next_code_point(std::string_view s, size_t& i) {
  UChar32 c;
  int32_t pos = static_cast<int32_t>(i);
  U8_NEXT_OR_FFFD(reinterpret_cast<const uint8_t*>(s.data()), pos, static_cast<int32_t>(s.size()),
                  c);
  i = static_cast<size_t>(pos);
  return static_cast<char32_t>(c);
}

void append_utf8(std::string& out, char32_t cp) {
  uint8_t buf[U8_MAX_LENGTH];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, static_cast<UChar32>(cp));
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  }
  return true;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const auto n = static_cast<int32_t>(s.size());
  for (int32_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    UChar32 c;
    U8_NEXT(p, i, n, c);
    if (c < 0) return false;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    append_utf8(out, next_code_point(s, i));
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_alphanumeric(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & (U_GC_L_MASK | U_GC_N_MASK)) != 0;
}

bool is_punctuation(char32_t cp) {
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_P_MASK) != 0;
}

namespace {

// The general-category mask of cp as Unicode 8.0 assigned it: 0 (unassigned) for later code
// points. Categories of older characters have been stable since.
uint32_t category_mask_v8(char32_t cp) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(cp), age);
  if (age[0] > 8) return 0;
  return U_GET_GC_MASK(static_cast<UChar32>(cp));
}

}  // namespace

bool is_bert_control(char32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  if (cp < 0x80) return cp < 0x20 || cp == 0x7F;
  return (category_mask_v8(cp) & (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CO_MASK | U_GC_CS_MASK)) != 0;
}

bool is_bert_punctuation(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
           (cp >= 123 && cp <= 126);
  }
  return (category_mask_v8(cp) & U_GC_P_MASK) != 0;
}

bool is_bert_accent(char32_t cp) {
  if (cp < 0x80) return false;
  return (category_mask_v8(cp) & U_GC_MN_MASK) != 0;
}

bool is_cjk_ideograph(char32_t cp) {
  // BERT's list (tokenization.py _is_chinese_char), which Hugging Face keeps.
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

namespace {

void check_icu(UErrorCode status, const char* what) {
  if (U_FAILURE(status)) {
    throw TokenizerError(std::string("tokenizer: ICU ") + what + " failed: " + u_errorName(status));
  }
}

std::u16string to_utf16(std::string_view s) {
  std::u16string out(s.size(), u'\0');
  int32_t n = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strFromUTF8WithSub(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &n,
                       s.data(), static_cast<int32_t>(s.size()), 0xFFFD, nullptr, &status);
  check_icu(status, "u_strFromUTF8");
  out.resize(static_cast<size_t>(n));
  return out;
}

void append_utf16_as_utf8(std::string& out, const UChar* s, int32_t n) {
  size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) * 3);
  int32_t written = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strToUTF8(out.data() + at, static_cast<int32_t>(out.size() - at), &written, s, n, &status);
  check_icu(status, "u_strToUTF8");
  out.resize(at + static_cast<size_t>(written));
}

const UNormalizer2* normalizer_for(NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case NormalForm::NFC:
      n = unorm2_getNFCInstance(&status);
      break;
    case NormalForm::NFD:
      n = unorm2_getNFDInstance(&status);
      break;
    case NormalForm::NFKC:
      n = unorm2_getNFKCInstance(&status);
      break;
    case NormalForm::NFKD:
      n = unorm2_getNFKDInstance(&status);
      break;
  }
  check_icu(status, "unorm2_get*Instance");
  return n;
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  if (is_ascii(s)) return std::string(s);  // ASCII is in every normal form
  const UNormalizer2* norm = normalizer_for(form);
  std::u16string src = to_utf16(s);
  UErrorCode status = U_ZERO_ERROR;
  auto src_len = static_cast<int32_t>(src.size());
  if (unorm2_isNormalized(norm, reinterpret_cast<const UChar*>(src.data()), src_len, &status) &&
      U_SUCCESS(status)) {
    return std::string(s);
  }
  // Decomposition grows text by at most a small factor; retry once with the size ICU asks for.
  std::vector<UChar> dst(src.size() * 4 + 16);
  status = U_ZERO_ERROR;
  int32_t n = unorm2_normalize(norm, reinterpret_cast<const UChar*>(src.data()), src_len,
                               dst.data(), static_cast<int32_t>(dst.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    dst.resize(static_cast<size_t>(n));
    status = U_ZERO_ERROR;
    n = unorm2_normalize(norm, reinterpret_cast<const UChar*>(src.data()), src_len, dst.data(),
                         static_cast<int32_t>(dst.size()), &status);
  }
  check_icu(status, "unorm2_normalize");
  std::string out;
  append_utf16_as_utf8(out, dst.data(), n);
  return out;
}

void append_lowercase(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    return;
  }
  // The full mapping (SpecialCasing's unconditional entries), in the root locale, as Rust's
  // char::to_lowercase.
  UChar src[2];
  int32_t src_len = 0;
  U16_APPEND_UNSAFE(src, src_len, static_cast<UChar32>(cp));
  UChar dst[8];
  UErrorCode status = U_ZERO_ERROR;
  int32_t n = u_strToLower(dst, 8, src, src_len, "", &status);
  check_icu(status, "u_strToLower");
  append_utf16_as_utf8(out, dst, n);
}

}  // namespace wick::tok
