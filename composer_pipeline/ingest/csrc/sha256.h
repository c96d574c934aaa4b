// SHA-256 (FIPS 180-4), for state ids: sha256("<session_key>|<stream_id>|<message_key>").hexdigest()[:20].
// The constants are the standard's (first 32 bits of the fractional parts of the cube roots of the
// first 64 primes; initial hash: square roots of the first 8). Tests compare against hashlib.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CP_SHA_NI 1
#endif

namespace cp {

// Round constants (FIPS 180-4 §4.2.2), shared by the SHA-NI and the portable rounds.
inline constexpr uint32_t kSha256K[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#ifdef CP_SHA_NI
// One 64-byte block with the x86 SHA extensions (SHA256RNDS2 does two rounds on the state held as
// ABEF/CDGH; SHA256MSG1/MSG2 compute the message schedule four words at a time). Chosen at run
// time where the CPU has them; the tests compare both paths with hashlib.
__attribute__((target("sha,sse4.1"))) inline void sha256_block_ni(uint32_t h[8], const uint8_t* data) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  // state words a..h -> ABEF and CDGH (lane 3 holds the first letter)
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));      // lanes: a b c d
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4));  // lanes: e f g h
  __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);                             // b a d c
  __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);                             // h g f e
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);                            // f e b a
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);                         // h g d c
  const __m128i abef0 = abef, cdgh0 = cdgh;
  __m128i w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), bswap);
  for (int g = 0; g < 16; ++g) {
    __m128i cur;
    if (g < 4) {
      cur = w[g];
    } else {  // W[t..t+3] from the four previous groups
      __m128i t = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
      t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
      cur = _mm_sha256msg2_epu32(t, w[(g + 3) & 3]);
      w[g & 3] = cur;
    }
    __m128i wk = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kSha256K + 4 * g)));
    cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
    abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
  }
  abef = _mm_add_epi32(abef, abef0);
  cdgh = _mm_add_epi32(cdgh, cdgh0);
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);                             // a b e f
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);                             // g h c d
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);                                 // a b c d
  hgfe = _mm_alignr_epi8(dchg, feba, 8);                                    // e f g h
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), hgfe);
}

inline bool cpu_has_sha_ni() {
  static const bool has = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

class Sha256 {
 public:
  Sha256() { reset(); }

  void reset() {
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, init, sizeof h_);
    len_ = 0;
    fill_ = 0;
  }

  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    len_ += n;
    while (n > 0) {
      size_t take = std::min(n, size_t(64) - fill_);
      std::memcpy(buf_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        block(buf_);
        fill_ = 0;
      }
    }
  }
  void update(std::string_view s) { update(s.data(), s.size()); }

  // hex digest, first ``chars`` characters (the object is finished afterwards)
  std::string hexdigest(size_t chars = 64) {
    uint64_t bits = len_ * 8;
    buf_[fill_++] = 0x80;
    if (fill_ > 56) {
      std::memset(buf_ + fill_, 0, 64 - fill_);
      block(buf_);
      fill_ = 0;
    }
    std::memset(buf_ + fill_, 0, 56 - fill_);
    for (int i = 0; i < 8; ++i) buf_[56 + i] = uint8_t(bits >> (56 - 8 * i));
    block(buf_);
    static const char* hex = "0123456789abcdef";
    char out[64];
    for (int i = 0; i < 8; ++i)
      for (int b = 0; b < 4; ++b) {
        uint8_t byte = uint8_t(h_[i] >> (8 * (3 - b)));
        out[8 * i + 2 * b] = hex[byte >> 4];
        out[8 * i + 2 * b + 1] = hex[byte & 15];
      }
    return std::string(out, std::min<size_t>(chars, 64));
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void block(const uint8_t* b) {
#ifdef CP_SHA_NI
    if (use_ni_) {
      sha256_block_ni(h_, b);
      return;
    }
#endif
    block_portable(b);
  }

  void block_portable(const uint8_t* b) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(b[4 * i]) << 24) | (uint32_t(b[4 * i + 1]) << 16) | (uint32_t(b[4 * i + 2]) << 8) |
             uint32_t(b[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      uint32_t ch = (e & f) ^ (~e & g);
      uint32_t t1 = h + S1 + ch + kSha256K[i] + w[i];
      uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      uint32_t maj = (a & bb) ^ (a & c) ^ (bb & c);
      uint32_t t2 = S0 + maj;
      h = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    h_[0] += a; h_[1] += bb; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }

#ifdef CP_SHA_NI
  bool use_ni_ = cpu_has_sha_ni();
#else
  bool use_ni_ = false;
#endif

 public:
  // tests: force the portable rounds, to compare both paths with hashlib
  void set_portable(bool portable) {
#ifdef CP_SHA_NI
    use_ni_ = !portable && cpu_has_sha_ni();
#else
    (void)portable;
#endif
  }

 private:
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_;
  uint64_t len_;
};

}  // namespace cp
