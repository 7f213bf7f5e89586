// FM-index over an integer alphabet: a Huffman-shaped wavelet matrix over the BWT of the reversed token text.
//
// Layout (all flat arrays owned by Python, possibly memory-mapped, and only read here):
//   T  = 0 s1 0 s2 ... 0 sk        the sequences as dense symbols (>= 1), each preceded by separator 0
//   R  = reverse(T), n symbols      searching R backwards = extending a prefix of T to the right
//   rows = n + 1 suffixes of R (row 0 = the empty suffix), BWT[row] = R[SA[row] - 1] (0 where SA = 0)
//   codes [sigma], code_lens [sigma] each symbol's Huffman code (MSB = first level); tree [internal][2] the
//                                   code tree (a child < 0 is the leaf of symbol -child - 1)
//   levels, levels_idx              every level's bits and rank entries (BitRank), concatenated; level l
//                                   holds the level_sizes[l] symbols whose code is longer than l
//   zeros   [L]                     zero bits per level
//   offsets [sigma]                 C[c] minus where symbol c starts in the order after its last level
//   marks   [blocks * 32]           rows whose suffix position is a multiple of sample_rate (+ marks_idx)
//   samples [marked rows]           suffix position / sample_rate, in row order
//   seps    [k]                     position in T of each sequence's separator (uint32: T < 2^31 symbols)
//   cache_* (optional)              next tokens of the widest ranges, computed at build time
// A search state is (sp, ep, m): the row range of the reversed prefix and the prefix length in symbols
// (the leading separator of an anchored prefix counts).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <thread>
#include <string>
#include <cstring>
#include <queue>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;
using u64 = uint64_t;
using u32 = uint32_t;

namespace {

// Bit vectors: plain words plus one 64-bit index entry per 2048-bit block (3% space): the count of ones
// before the block (high 34 bits) and the ones in its first three 512-bit sub-blocks (10 bits each).
// A rank reads the entry and at most 8 words of one sub-block.
constexpr u64 kBlockBits = 2048;
constexpr u64 kBlockWords = kBlockBits / 64;

inline u64 blocks_for(u64 nbits) { return nbits / kBlockBits + 1; }  // +1 so rank(nbits) has a block

struct BitRank {
    const u64* bits = nullptr;
    const u64* idx = nullptr;
    u64 size = 0;  // bits; rank1(i) reads in bounds for i <= size, get(i) for i < size

    inline u64 rank1(u64 i) const {
        const u64 e = idx[i >> 11];
        u64 r = e >> 30;
        const unsigned sub = (i >> 9) & 3;
        if (sub > 0) r += (e >> 20) & 1023;
        if (sub > 1) r += (e >> 10) & 1023;
        if (sub > 2) r += e & 1023;
        const u64 wi = i >> 6;
        for (u64 w = (i >> 9) << 3; w < wi; ++w) r += __builtin_popcountll(bits[w]);
        const unsigned b = i & 63;
        if (b) r += __builtin_popcountll(bits[wi] << (64 - b));
        return r;
    }
    inline u64 rank0(u64 i) const { return i - rank1(i); }
    inline bool get(u64 i) const { return (bits[i >> 6] >> (i & 63)) & 1; }
    // Ones in [a, b) for a narrow range: the words in between, no second directory read.
    inline u64 ones_between(u64 a, u64 b) const {
        u64 wa = a >> 6, wb = b >> 6;
        if (wa == wb) return __builtin_popcountll((bits[wa] >> (a & 63)) & ((1ULL << (b - a)) - 1));
        u64 r = __builtin_popcountll(bits[wa] >> (a & 63));
        for (u64 w = wa + 1; w < wb; ++w) r += __builtin_popcountll(bits[w]);
        if (b & 63) r += __builtin_popcountll(bits[wb] << (64 - (b & 63)));
        return r;
    }
    // rank1 at both ends of [a, b)
    inline void rank1_pair(u64 a, u64 b, u64& ra, u64& rb) const {
        ra = rank1(a);
        rb = (b - a <= 512) ? ra + ones_between(a, b) : rank1(b);
    }
};

// Fill the index entries of a bit vector whose words are already set.
void finish_ranks(const u64* bits, u64* idx, u64 nblocks) {
    u64 total = 0;
    for (u64 b = 0; b < nblocks; ++b) {
        u64 c[4] = {0, 0, 0, 0};
        for (unsigned k = 0; k < kBlockWords; ++k) c[k >> 3] += __builtin_popcountll(bits[b * kBlockWords + k]);
        idx[b] = (total << 30) | (c[0] << 20) | (c[1] << 10) | c[2];
        total += c[0] + c[1] + c[2] + c[3];
    }
}

inline void set_bit(u64* d, u64 i) { d[i >> 6] |= (1ULL << (i & 63)); }

template <typename T>
const T* ptr_of(const py::array_t<T, py::array::c_style>& a) {
    return a.data();
}

// ------------------------------------------------------------------------------------------- build

#include "build.hpp"

// ------------------------------------------------------------------------------------------ query

// A value read from an index's arrays that points outside them: the index is damaged (grtool.index._fm.DamagedIndex,
// an InputError). Every offset a query follows is checked before it is read, so no byte pattern crashes.
struct DamagedIndex : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class FMIndex {
   public:
    FMIndex(py::array_t<u64, py::array::c_style> levels, py::array_t<u64, py::array::c_style> levels_idx,
            py::array_t<u64, py::array::c_style> level_sizes, py::array_t<u64, py::array::c_style> zeros,
            py::array_t<int64_t, py::array::c_style> offsets, py::array_t<u64, py::array::c_style> marks,
            py::array_t<u64, py::array::c_style> marks_idx, py::array_t<u32, py::array::c_style> samples, py::array_t<u32, py::array::c_style> seps,
            py::array_t<int32_t, py::array::c_style> tok2sym, py::array_t<u32, py::array::c_style> sym2tok,
            py::array_t<u32, py::array::c_style> codes, py::array_t<uint8_t, py::array::c_style> code_lens,
            py::array_t<int32_t, py::array::c_style> tree, u64 n, int L, u64 sample_rate, u64 dollar_row)
        : dollar_row_(dollar_row), levels_(levels), levels_idx_(levels_idx), level_sizes_(level_sizes), zeros_(zeros), offsets_(offsets), marks_(marks), marks_idx_(marks_idx), samples_(samples), seps_(seps),
          tok2sym_(tok2sym), sym2tok_(sym2tok), codes_(codes), code_lens_(code_lens), tree_(tree), n_(n), L_(L), sample_rate_(sample_rate) {
        if (static_cast<int>(level_sizes.size()) != L || static_cast<int>(zeros.size()) < L) throw std::invalid_argument("level_sizes: bad shape");
        if (codes.size() != offsets.size() || code_lens.size() != offsets.size()) throw std::invalid_argument("codes: size does not match sigma");
        if (L > 0 && (tree.ndim() != 2 || tree.shape(1) != 2)) throw std::invalid_argument("tree: bad shape");
        if (L < 0 || L > kMaxCode) throw std::invalid_argument("levels: more than the longest code");
        if (sample_rate == 0) throw std::invalid_argument("sample_rate: zero");
        // rows 0..n, row 0 the empty suffix: the whole text (the sentinel's BWT slot) is one of rows 1..n
        if (dollar_row == 0 || dollar_row > n) throw std::invalid_argument("index.json params.dollar_row: not one of the rows 1..n");
        if (static_cast<u64>(seps.size()) > n) throw std::invalid_argument("seps: more sequences than symbols");
        const u64 sigma = static_cast<u64>(offsets.size());
        if (static_cast<u64>(sym2tok.size()) < sigma) throw std::invalid_argument("sym2tok: shorter than sigma");
        for (py::ssize_t c = 0; c < codes.size(); ++c)
            if (code_lens.data()[c] > L) throw std::invalid_argument("code_lens: a code longer than the levels");
        for (py::ssize_t t = 0; t < tok2sym.size(); ++t)
            if (tok2sym.data()[t] >= static_cast<int64_t>(sigma)) throw std::invalid_argument("tok2sym: a symbol beyond sigma");
        // the code tree: every child an internal node of it or the leaf of a symbol
        const int64_t inner = L > 0 ? static_cast<int64_t>(tree.shape(0)) : 0;
        if (L > 0 && inner < 1) throw std::invalid_argument("tree: empty");
        for (int64_t v = 0; v < 2 * inner; ++v) {
            const int64_t ch = tree.data()[v];
            if (ch >= inner || (ch < 0 && -ch - 1 >= static_cast<int64_t>(sigma))) throw std::invalid_argument("tree: a child outside the tree");
        }
        // a tree (each node reached once from the root) no deeper than the levels: a traversal stays in lv_
        if (L > 0) {
            std::vector<int> depth(static_cast<size_t>(inner), -1);
            std::vector<int64_t> todo{0};
            depth[0] = 0;
            while (!todo.empty()) {
                const int64_t v = todo.back();
                todo.pop_back();
                for (int bit = 0; bit < 2; ++bit) {
                    const int64_t ch = tree.data()[2 * v + bit];
                    if (ch < 0) continue;
                    if (depth[ch] >= 0 || depth[v] + 1 >= L) throw std::invalid_argument("tree: not a code tree of the levels' depth");
                    depth[ch] = depth[v] + 1;
                    todo.push_back(ch);
                }
            }
        }
        u64 wo = 0, io = 0;
        for (int l = 0; l < L; ++l) {
            const u64 m = level_sizes.data()[l];
            if (l == 0 && m != n + 1) throw std::invalid_argument("levels: size does not match n");
            if (m > n + 1) throw std::invalid_argument("level_sizes: a level larger than the rows");
            lv_.push_back(BitRank{levels.data() + wo, levels_idx.data() + io, m});
            wo += blocks_for(m) * kBlockWords;
            io += blocks_for(m);
        }
        if (static_cast<u64>(levels.size()) < wo || static_cast<u64>(levels_idx.size()) < io) throw std::invalid_argument("levels: too short");
        const u64 nblocks = blocks_for(n + 1);
        if (static_cast<u64>(marks.size()) != nblocks * kBlockWords) throw std::invalid_argument("marks: size does not match n");
        if (static_cast<u64>(marks_idx.size()) != nblocks) throw std::invalid_argument("marks_idx: size does not match n");
        mk_ = BitRank{marks.data(), marks_idx.data(), n + 1};
        // position 0 is always sampled, and only its sample is 0: the whole text's row is that marked row
        const u64 whole = mk_.rank1(dollar_row);
        if (!mk_.get(dollar_row) || whole >= static_cast<u64>(samples.size()) || samples.data()[whole] != 0)
            throw std::invalid_argument("index.json params.dollar_row: not the row of the whole text (no sample of position 0 there)");
        z_ = zeros.data();
        off_ = offsets.data();
        sigma_ = static_cast<u64>(offsets.size());
        samp_ = samples.data();
        n_samples_ = static_cast<u64>(samples.size());
        sep_ = seps.data();
        k_ = static_cast<u64>(seps.size());
        t2s_ = tok2sym.data();
        vocab_ = static_cast<u64>(tok2sym.size());
        s2t_ = sym2tok.data();
        code_ = codes.data();
        clen_ = code_lens.data();
        tree_p_ = tree.data();
    }

    void set_label(const std::string& label) { label_ = label; }

    // Throws the damaged-index error naming the index (cold: the checks' branches stay predicted).
    [[noreturn]] __attribute__((noinline, cold)) void damaged(const char* what) const {
        throw DamagedIndex("index " + label_ + ": " + what + " (damaged); rebuild it with `grtool index build`");
    }
    inline void check_range(u64 sp, u64 ep) const {
        if (ep > n_ + 1 || sp > ep) throw std::invalid_argument("a search state outside this index");
    }

    u64 size() const { return n_; }
    u64 sequences() const { return k_; }
    u64 sigma() const { return sigma_; }
    int levels() const { return L_; }

    // The prefix anchored at a sequence start (the separator range), or any position.
    std::tuple<u64, u64, u64> start(bool anchored) const {
        if (!anchored) return {0, n_ + 1, 0};  // every row: the next symbol is any token
        return {1, 1 + k_, 1};
    }

    inline int sym_of(int64_t token) const {
        if (token < 0 || static_cast<u64>(token) >= vocab_) return -1;
        return t2s_[token];
    }

    std::tuple<u64, u64, u64> extend(const std::tuple<u64, u64, u64>& st, int64_t token) const {
        const auto [sp, ep, m] = st;
        const int c = sym_of(token);
        if (c <= 0 || sp >= ep) return {0, 0, m + 1};
        check_range(sp, ep);
        u64 a = sp, b = ep;
        const u32 code = code_[c];
        const int len = clen_[c];
        for (int l = 0; l < len; ++l) {
            const BitRank& bv = lv_[l];
            if (__builtin_expect(b > bv.size, 0)) damaged("fm_levels: a rank beyond its level");
            u64 ra, rb;
            bv.rank1_pair(a, b, ra, rb);
            if ((code >> (len - 1 - l)) & 1) {
                a = z_[l] + ra;
                b = z_[l] + rb;
            } else {
                a -= ra;
                b -= rb;
            }
            if (a >= b) return {0, 0, m + 1};
        }
        const int64_t o = off_[c];
        const int64_t ra = o + static_cast<int64_t>(a), rb = o + static_cast<int64_t>(b);
        if (__builtin_expect(ra < 0 || rb > static_cast<int64_t>(n_ + 1) || ra > rb, 0)) damaged("fm_offsets: a row beyond the index");
        return {static_cast<u64>(ra), static_cast<u64>(rb), m + 1};
    }

    // Distinct symbols of BWT[sp, ep) with their counts, ascending by token id (separator excluded).
    void distinct(u64 sp, u64 ep, std::vector<u32>& ids, std::vector<u64>& counts) const {
        if (sp >= ep) return;
        if (L_ == 0) return;  // only the separator exists
        struct Frame {
            u64 a, b;
            int32_t node;
            int level;
        };
        Frame stack[kMaxCode * 2 + 2];
        int top = 0;
        stack[top++] = {sp, ep, 0, 0};
        const size_t first = ids.size();
        while (top) {
            const Frame f = stack[--top];
            const BitRank& bv = lv_[f.level];
            if (__builtin_expect(f.b > bv.size, 0)) damaged("fm_levels: a rank beyond its level");
            u64 r1a, r1b;
            bv.rank1_pair(f.a, f.b, r1a, r1b);
            const u64 oa = r1b - r1a;         // ones in range
            const u64 za = (f.b - f.a) - oa;  // zeros in range
            const int32_t* ch = tree_p_ + 2 * f.node;
            if (oa) {
                const u64 a1 = z_[f.level] + r1a, b1 = z_[f.level] + r1b;
                if (ch[1] < 0) emit(static_cast<u32>(-ch[1] - 1), b1 - a1, ids, counts);
                else stack[top++] = {a1, b1, ch[1], f.level + 1};
            }
            if (za) {
                const u64 a0 = f.a - r1a, b0 = f.b - r1b;
                if (ch[0] < 0) emit(static_cast<u32>(-ch[0] - 1), b0 - a0, ids, counts);
                else stack[top++] = {a0, b0, ch[0], f.level + 1};
            }
        }
        const size_t got = ids.size() - first;
        if (got > 1) {  // the code order is not the id order
            std::vector<std::pair<u32, u64>> pairs(got);
            for (size_t i = 0; i < got; ++i) pairs[i] = {ids[first + i], counts[first + i]};
            std::sort(pairs.begin(), pairs.end());
            for (size_t i = 0; i < got; ++i) {
                ids[first + i] = pairs[i].first;
                counts[first + i] = pairs[i].second;
            }
        }
    }

    inline void emit(u32 sym, u64 count, std::vector<u32>& ids, std::vector<u64>& counts) const {
        if (sym == 0) return;  // the separator
        ids.push_back(s2t_[sym]);
        counts.push_back(count);
    }

    py::tuple next_tokens(const std::tuple<u64, u64, u64>& st) const {
        const u64 sp = std::get<0>(st), ep = std::get<1>(st);
        check_range(sp, ep);
        // Wide ranges (the first tokens after <docid_start>) list thousands of tokens and recur at every
        // docid a decoder starts: keep their answers (read-only arrays), bounded.
        const bool wide = ep > sp && ep - sp >= kCacheMinRows;
        const u64 key = sp * 0x9E3779B97F4A7C15ULL ^ ep;
        if (wide) {
            auto hit = cache_.find(key);
            if (hit != cache_.end() && hit->second.sp == sp && hit->second.ep == ep) return hit->second.answer;
        }
        py::array_t<u32> a;
        py::array_t<u64> c;
        if (wide && persisted(sp, ep, a, c)) {
        } else {
            std::vector<u32> ids;
            std::vector<u64> counts;
            distinct(sp, ep, ids, counts);
            a = py::array_t<u32>(ids.size());
            c = py::array_t<u64>(counts.size());
            std::copy(ids.begin(), ids.end(), a.mutable_data());
            std::copy(counts.begin(), counts.end(), c.mutable_data());
        }
        py::tuple answer = py::make_tuple(a, c);
        if (wide) {
            py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            py::detail::array_proxy(c.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            if (cache_.size() >= kCacheEntries) cache_.clear();
            cache_[key] = Cached{sp, ep, answer};
        }
        return answer;
    }

    // BWT symbol at a row and the row it maps to (LF), walking the levels once.
    inline std::pair<u32, u64> lf(u64 row) const {
        u32 c = 0;
        u64 i = row;
        int32_t node = 0;
        for (int l = 0; l < L_; ++l) {
            const BitRank& bv = lv_[l];
            if (__builtin_expect(i >= bv.size, 0)) damaged("fm_levels: a rank beyond its level");
            const bool bit = bv.get(i);
            i = bit ? z_[l] + bv.rank1(i) : bv.rank0(i);
            const int32_t nx = tree_p_[2 * node + bit];
            if (nx < 0) {
                c = static_cast<u32>(-nx - 1);
                break;
            }
            node = nx;
        }
        // The whole-text suffix has no predecessor; its BWT slot holds a stand-in 0 that separator ranks
        // must not count.
        const u64 fix = (c == 0 && row > dollar_row_) ? 1 : 0;
        return {c, next_row(off_[c] + static_cast<int64_t>(i), fix)};
    }

    // The row an LF step lands on, checked: a walk only ever visits rows [0, n].
    inline u64 next_row(int64_t at, u64 fix) const {
        if (__builtin_expect(at < static_cast<int64_t>(fix) || at - static_cast<int64_t>(fix) > static_cast<int64_t>(n_), 0))
            damaged("fm_offsets: an LF step beyond the rows");
        return static_cast<u64>(at) - fix;
    }
    // The suffix position of a marked row (a sample) plus the LF steps that led to it, checked.
    inline u64 sampled(u64 row, u64 steps) const {
        const u64 r = mk_.rank1(row);
        if (__builtin_expect(r >= n_samples_, 0)) damaged("fm_marks: a mark beyond the samples");
        const u64 q = static_cast<u64>(samp_[r]) * sample_rate_ + steps;
        if (__builtin_expect(q > n_, 0)) damaged("fm_samples: a position beyond the text");
        return q;
    }

    // Position in R of the suffix at a row.
    u64 suffix_at(u64 row) const {
        u64 steps = 0;
        while (!mk_.get(row)) {
            row = lf(row).second;
            if (++steps > sample_rate_) damaged("fm_marks: a walk that meets no sample");
        }
        return sampled(row, steps);
    }

    // (sequence, offset of the first prefix token in it) for up to `limit` occurrences, sorted.
    u64 count(const std::tuple<u64, u64, u64>& st) const {
        const auto [sp, ep, m] = st;
        if (m == 0) return n_ - k_;  // the empty unanchored prefix occurs before every token
        return ep > sp ? ep - sp : 0;
    }

    // Suffix positions of many rows at once: their LF walks advance level by level side by side, with the next
    // level's words prefetched, so the memory latencies of the walks overlap instead of adding up.
    void suffixes_at(const u64* rows, u64 cnt, u64* out) const {
        std::vector<u64> pos(rows, rows + cnt), steps(cnt, 0), cur(cnt);
        std::vector<u32> sym(cnt), active(cnt);
        for (u64 i = 0; i < cnt; ++i) active[i] = static_cast<u32>(i);
        while (!active.empty()) {
            size_t w = 0;
            for (u32 a : active) {
                if (mk_.get(pos[a])) {
                    out[a] = sampled(pos[a], steps[a]);
                } else if (steps[a] >= sample_rate_) {
                    damaged("fm_marks: a walk that meets no sample");
                } else {
                    active[w++] = a;
                    cur[a] = pos[a];
                    sym[a] = 0;  // the node while walking (>= 0), then the symbol
                    if (L_ > 0) {
                        __builtin_prefetch(lv_[0].bits + (pos[a] >> 6));
                        __builtin_prefetch(lv_[0].idx + (pos[a] >> 11));
                    }
                }
            }
            active.resize(w);
            std::vector<u32> walking(active), done;
            std::vector<int32_t> node(cnt, 0);
            for (int l = 0; l < L_ && !walking.empty(); ++l) {
                const BitRank& bv = lv_[l];
                const BitRank* nx = l + 1 < L_ ? &lv_[l + 1] : nullptr;
                const u64 level_size = bv.size;  // in a register: the stores to cur[] could alias bv.size
                size_t keep = 0;
                for (u32 a : walking) {
                    const u64 i = cur[a];
                    if (__builtin_expect(i >= level_size, 0)) damaged("fm_levels: a rank beyond its level");
                    const bool bit = bv.get(i);
                    const u64 j = bit ? z_[l] + bv.rank1(i) : bv.rank0(i);
                    cur[a] = j;
                    const int32_t t = tree_p_[2 * node[a] + bit];
                    if (t < 0) {
                        sym[a] = static_cast<u32>(-t - 1);
                        continue;
                    }
                    node[a] = t;
                    walking[keep++] = a;
                    if (nx) {
                        __builtin_prefetch(nx->bits + (j >> 6));
                        __builtin_prefetch(nx->idx + (j >> 11));
                    }
                }
                walking.resize(keep);
            }
            for (u32 a : active) {
                const u32 c = sym[a];
                const u64 fix = (c == 0 && pos[a] > dollar_row_) ? 1 : 0;
                pos[a] = next_row(off_[c] + static_cast<int64_t>(cur[a]), fix);
                ++steps[a];
                __builtin_prefetch(mk_.bits + (pos[a] >> 6));
            }
        }
    }

    py::array_t<int64_t> locate(const std::tuple<u64, u64, u64>& st, u64 limit) const {
        const auto [sp, ep, m] = st;
        if (m == 0) throw std::invalid_argument("locate needs a non-empty prefix");
        if (sp < ep) check_range(sp, ep);
        const u64 take = sp < ep ? std::min(limit, ep - sp) : 0;
        std::vector<u64> rows(take), qs(take);
        for (u64 i = 0; i < take; ++i) rows[i] = sp + i;
        std::vector<std::pair<int64_t, int64_t>> hits;
        hits.reserve(take);
        {
            py::gil_scoped_release release;
            suffixes_at(rows.data(), take, qs.data());
            for (u64 i = 0; i < take; ++i) {
                if (qs[i] + m > n_) damaged("fm_samples: an occurrence beyond the text");
                const u64 j = n_ - qs[i] - m;  // start of the prefix in T
                const u32* after = std::upper_bound(sep_, sep_ + k_, static_cast<u32>(j));
                if (after == sep_) damaged("fm_seps: an occurrence before the first sequence");
                const u64 seq = static_cast<u64>(after - sep_) - 1;
                const int64_t off = static_cast<int64_t>(j) - static_cast<int64_t>(sep_[seq]) - 1;
                hits.emplace_back(static_cast<int64_t>(seq), std::max<int64_t>(off, 0));
            }
            std::sort(hits.begin(), hits.end());
        }
        py::array_t<int64_t> out({static_cast<py::ssize_t>(hits.size()), static_cast<py::ssize_t>(2)});
        int64_t* o = out.mutable_data();
        for (size_t i = 0; i < hits.size(); ++i) {
            o[2 * i] = hits[i].first;
            o[2 * i + 1] = hits[i].second;
        }
        return out;
    }

    // The wide ranges a decoder meets first, widest first (anchored at a sequence start, at least `min_rows`
    // rows, up to `max_entries` next-token entries in all), for persisting at build time:
    // (ranges [m, 2] (sp, ep) sorted, offsets [m + 1], ids, counts).
    py::tuple wide_ranges(u64 min_rows, u64 max_entries) const {
        struct R {
            u64 sp, ep;
            bool operator<(const R& o) const { return (ep - sp) < (o.ep - o.sp); }
        };
        std::vector<std::tuple<u64, u64, std::vector<u32>, std::vector<u64>>> got;
        u64 entries = 0;
        {
            py::gil_scoped_release release;
            std::priority_queue<R> todo;
            if (k_ >= min_rows) todo.push({1, 1 + k_});
            std::vector<u32> ids;
            std::vector<u64> counts;
            while (!todo.empty()) {
                check_cancel();
                const R r = todo.top();
                todo.pop();
                ids.clear();
                counts.clear();
                distinct(r.sp, r.ep, ids, counts);
                for (size_t i = 0; i < ids.size(); ++i) {
                    if (counts[i] < min_rows) continue;
                    const auto [a, b, m] = extend({r.sp, r.ep, 1}, ids[i]);
                    if (b > a) todo.push({a, b});
                }
                if (entries + ids.size() > max_entries) continue;  // too long for what is left; its children may fit
                entries += ids.size();
                got.emplace_back(r.sp, r.ep, ids, counts);
            }
            std::sort(got.begin(), got.end(), [](const auto& x, const auto& y) {
                return std::make_pair(std::get<0>(x), std::get<1>(x)) < std::make_pair(std::get<0>(y), std::get<1>(y));
            });
        }
        py::array_t<u64> ranges({static_cast<py::ssize_t>(got.size()), static_cast<py::ssize_t>(2)});
        py::array_t<u64> offsets(got.size() + 1);
        py::array_t<u32> ids(entries);
        py::array_t<u64> counts(entries);
        u64* rg = ranges.mutable_data();
        u64* of = offsets.mutable_data();
        u32* id = ids.mutable_data();
        u64* ct = counts.mutable_data();
        u64 at = 0;
        of[0] = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            rg[2 * i] = std::get<0>(got[i]);
            rg[2 * i + 1] = std::get<1>(got[i]);
            const auto& gi = std::get<2>(got[i]);
            const auto& gc = std::get<3>(got[i]);
            for (size_t j = 0; j < gi.size(); ++j, ++at) {
                id[at] = gi[j];
                ct[at] = gc[j];
            }
            of[i + 1] = at;
        }
        return py::make_tuple(ranges, offsets, ids, counts);
    }

    // Use persisted wide ranges (from `wide_ranges`, kept alive here; may be memory-mapped).
    void set_persisted(py::array_t<u64, py::array::c_style> ranges, py::array_t<u64, py::array::c_style> offsets,
                       py::array_t<u32, py::array::c_style> ids, py::array_t<u64, py::array::c_style> counts) {
        if (ranges.size() % 2 || static_cast<u64>(offsets.size()) != static_cast<u64>(ranges.size()) / 2 + 1 || ids.size() != counts.size())
            throw std::invalid_argument("persisted ranges: bad shapes");
        // the answers are views into ids/counts: their offsets ascend within them; ranges inside the rows
        const u64* of = offsets.data();
        if (of[0] != 0 || of[offsets.size() - 1] > static_cast<u64>(ids.size())) throw std::invalid_argument("cache_offsets: beyond cache_ids");
        for (py::ssize_t i = 1; i < offsets.size(); ++i)
            if (of[i] < of[i - 1]) throw std::invalid_argument("cache_offsets: not ascending");
        for (py::ssize_t i = 0; i < ranges.size(); i += 2)
            if (ranges.data()[i] > ranges.data()[i + 1] || ranges.data()[i + 1] > n_ + 1) throw std::invalid_argument("cache_ranges: beyond the rows");
        p_ranges_ = ranges;
        p_offsets_ = offsets;
        p_ids_ = ids;
        p_counts_ = counts;
        p_n_ = static_cast<u64>(ranges.size()) / 2;
    }

    void clear_cache() { cache_.clear(); }

    // Where each symbol's block starts in the last level's order (for building `offsets`).
    py::array_t<u64> symbol_starts(u64 sigma) const {
        py::array_t<u64> out(sigma);
        u64* o = out.mutable_data();
        for (u64 c = 0; c < sigma; ++c) {
            u64 a = 0;
            const int len = clen_[c];
            for (int l = 0; l < len; ++l) {
                const BitRank& bv = lv_[l];
                a = ((code_[c] >> (len - 1 - l)) & 1) ? z_[l] + bv.rank1(a) : bv.rank0(a);
            }
            o[c] = a;
        }
        return out;
    }

   private:
    bool persisted(u64 sp, u64 ep, py::array_t<u32>& a, py::array_t<u64>& c) const {
        if (!p_n_) return false;
        const u64* rg = p_ranges_.data();
        u64 lo = 0, hi = p_n_;
        while (lo < hi) {
            const u64 mid = (lo + hi) / 2;
            if (rg[2 * mid] < sp || (rg[2 * mid] == sp && rg[2 * mid + 1] < ep)) lo = mid + 1;
            else hi = mid;
        }
        if (lo == p_n_ || rg[2 * lo] != sp || rg[2 * lo + 1] != ep) return false;
        const u64 b = p_offsets_.data()[lo], e = p_offsets_.data()[lo + 1];
        // read-only views into the persisted arrays (no copy; they keep the arrays alive)
        a = py::array_t<u32>({static_cast<py::ssize_t>(e - b)}, {static_cast<py::ssize_t>(sizeof(u32))}, p_ids_.data() + b, p_ids_);
        c = py::array_t<u64>({static_cast<py::ssize_t>(e - b)}, {static_cast<py::ssize_t>(sizeof(u64))}, p_counts_.data() + b, p_counts_);
        py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        py::detail::array_proxy(c.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        return true;
    }
    py::array_t<u64, py::array::c_style> p_ranges_, p_offsets_;
    py::array_t<u32, py::array::c_style> p_ids_;
    py::array_t<u64, py::array::c_style> p_counts_;
    u64 p_n_ = 0;
    static constexpr u64 kCacheMinRows = 1024;
    static constexpr size_t kCacheEntries = 4096;
    struct Cached {
        u64 sp, ep;
        py::tuple answer;
    };
    mutable std::unordered_map<u64, Cached> cache_;
    u64 dollar_row_;
    // Keep the Python buffers alive (they may be memory maps).
    py::array_t<u64, py::array::c_style> levels_, levels_idx_, level_sizes_, zeros_;
    py::array_t<int64_t, py::array::c_style> offsets_;
    py::array_t<u64, py::array::c_style> marks_, marks_idx_;
    py::array_t<u32, py::array::c_style> samples_;
    py::array_t<u32, py::array::c_style> seps_;
    py::array_t<int32_t, py::array::c_style> tok2sym_;
    py::array_t<u32, py::array::c_style> sym2tok_;
    py::array_t<u32, py::array::c_style> codes_;
    py::array_t<uint8_t, py::array::c_style> code_lens_;
    py::array_t<int32_t, py::array::c_style> tree_;
    const u32* code_ = nullptr;
    const uint8_t* clen_ = nullptr;
    const int32_t* tree_p_ = nullptr;
    u64 n_;
    int L_;
    u64 sample_rate_;
    std::vector<BitRank> lv_;
    BitRank mk_;
    const u64* z_ = nullptr;
    const int64_t* off_ = nullptr;
    u64 sigma_ = 0;
    const u32* samp_ = nullptr;
    u64 n_samples_ = 0;
    std::string label_ = "<memory>";
    const u32* sep_ = nullptr;
    u64 k_ = 0;
    const int32_t* t2s_ = nullptr;
    u64 vocab_ = 0;
    const u32* s2t_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_fm, m) {
    m.doc() = "Native FM-index (wavelet matrix over the BWT of reversed token sequences).";
    // A damaged index is bad input: the error is grtool's InputError (one line, exit 2), not a crash.
    py::register_exception<DamagedIndex>(m, "DamagedIndex", py::module_::import("grtool.errors").attr("InputError"));
    py::register_exception<BuildCancelled>(m, "BuildCancelled", PyExc_RuntimeError);
    m.def("set_cancel", [](bool on) { g_cancel.store(on); }, py::arg("on"),
          "Ask a running build (on another thread) to stop: it throws BuildCancelled within a fraction of a second.");
    m.def("dense_alphabet", &dense_alphabet, py::arg("flat"), py::arg("drop_pages") = false);
    m.def("build_fm", &build_fm, py::arg("flat"), py::arg("lengths"), py::arg("tok2sym"), py::arg("sigma"), py::arg("sample_rate"),
          py::arg("max_items"), py::arg("scratch"), py::arg("drop_pages") = false, py::arg("consume") = "");
    py::class_<FMIndex>(m, "FMIndex")
        .def(py::init<py::array_t<u64, py::array::c_style>, py::array_t<u64, py::array::c_style>,
                      py::array_t<u64, py::array::c_style>, py::array_t<u64, py::array::c_style>, py::array_t<int64_t, py::array::c_style>,
                      py::array_t<u64, py::array::c_style>, py::array_t<u64, py::array::c_style>,
                      py::array_t<u32, py::array::c_style>, py::array_t<u32, py::array::c_style>,
                      py::array_t<int32_t, py::array::c_style>, py::array_t<u32, py::array::c_style>,
                      py::array_t<u32, py::array::c_style>, py::array_t<uint8_t, py::array::c_style>,
                      py::array_t<int32_t, py::array::c_style>, u64, int, u64, u64>(),
             py::arg("levels"), py::arg("levels_idx"), py::arg("level_sizes"), py::arg("zeros"), py::arg("offsets"), py::arg("marks"),
             py::arg("marks_idx"), py::arg("samples"),
             py::arg("seps"), py::arg("tok2sym"), py::arg("sym2tok"), py::arg("codes"), py::arg("code_lens"), py::arg("tree"),
             py::arg("n"), py::arg("L"), py::arg("sample_rate"), py::arg("dollar_row"))
        .def_property_readonly("size", &FMIndex::size)
        .def_property_readonly("sequences", &FMIndex::sequences)
        .def_property_readonly("sigma", &FMIndex::sigma)
        .def_property_readonly("levels", &FMIndex::levels)
        .def("start", &FMIndex::start, py::arg("anchored") = true)
        .def("extend", &FMIndex::extend, py::arg("state"), py::arg("token"))
        .def("next_tokens", &FMIndex::next_tokens, py::arg("state"))
        .def("count", &FMIndex::count, py::arg("state"))
        .def("locate", &FMIndex::locate, py::arg("state"), py::arg("limit"))
        .def("symbol_starts", &FMIndex::symbol_starts, py::arg("sigma"))
        .def("wide_ranges", &FMIndex::wide_ranges, py::arg("min_rows"), py::arg("max_entries"))
        .def("set_persisted", &FMIndex::set_persisted, py::arg("ranges"), py::arg("offsets"), py::arg("ids"), py::arg("counts"))
        .def("clear_cache", &FMIndex::clear_cache)
        .def("set_label", &FMIndex::set_label, py::arg("label"));
}
