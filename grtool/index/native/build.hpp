// Construction of the FM-index arrays, included by fm_index.cpp (one extension module).
//
// The suffix order of R is found in bounded memory, never as one suffix array of the whole text (4 bytes a
// symbol). R is a run of blocks, each a reversed sequence closed by its separator. A suffix compares as its
// *local string* (from its position through its block's separator, which no token equals) and, when the local
// strings are equal, as the whole blocks that follow the two separators. So:
//   1. the blocks' local strings are sorted and named, and SA-IS over the sequence of names ranks every
//      block's suffix: the *tie* of the block before it (k entries, not n);
//   2. every suffix is then sorted by (local string, tie), one bucket at a time (a range of first symbols,
//      split by the following symbols where one symbol alone is too many), from 64-bit keys that hold the
//      next few symbols; each bucket's rows stream their BWT symbol to a scratch file;
//   3. the Huffman-shaped wavelet matrix is filled from that file in one pass.
// Peak memory: the text at log2(sigma) bits a symbol, a tie and a separator position per sequence and one
// bucket of 16-byte items. Scratch disk: 4 bytes a suffix not yet sorted plus 4 a BWT symbol written (about 4
// bytes a symbol in all: a bucket's disk is given back as it is read).
// Local strings are short (a docid, a title, a document), which is what keeps the sorting fast.

// A build stops within a fraction of a second of a cancel (SIGINT/SIGTERM, set from Python while the build runs on
// a worker thread): its long loops look at this flag every so often and throw BuildCancelled; the scratch
// files are removed as the exception unwinds (ScratchFile, Spill).
std::atomic<bool> g_cancel{false};
struct BuildCancelled : std::runtime_error {
    BuildCancelled() : std::runtime_error("the index build was cancelled") {}
};
inline void check_cancel() {
    if (g_cancel.load(std::memory_order_relaxed)) throw BuildCancelled();
}
constexpr u64 kCancelEvery = (1u << 20) - 1;  // positions between two looks at the flag in the text scans

// Drop the pages of [from, to) of a read-only file mapping from this process (they stay in the page cache).
inline void drop_mapped(const void* from, const void* to) {
    const uintptr_t page = 4096;
    uintptr_t a = (reinterpret_cast<uintptr_t>(from) + page - 1) & ~(page - 1);
    uintptr_t b = reinterpret_cast<uintptr_t>(to) & ~(page - 1);
    if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

// The reversed text s[0..n]: s[i] = symbol of R[i] + 1 (separator 0 -> 1, tokens >= 2), s[n] = 0 (a unique
// smallest sentinel, so the empty suffix is row 0), packed at the fewest bits that hold sigma.
struct PackedText {
    std::vector<u64> words;
    unsigned w;
    u64 mask;
    PackedText(u64 len, unsigned width) : words((len * width + 63) / 64 + 2, 0), w(width), mask((1ULL << width) - 1) {}
    inline u32 operator[](u64 i) const {
        const u64 bit = i * w, wi = bit >> 6;
        const unsigned __int128 x = (static_cast<unsigned __int128>(words[wi + 1]) << 64) | words[wi];
        return static_cast<u32>(static_cast<u64>(x >> (bit & 63)) & mask);
    }
    inline void prefetch(u64 i) const { __builtin_prefetch(words.data() + ((i * w) >> 6)); }
    inline void set(u64 i, u32 v) {  // each position once, over zeros
        const u64 bit = i * w, wi = bit >> 6;
        const unsigned sh = bit & 63;
        words[wi] |= static_cast<u64>(v) << sh;
        if (sh + w > 64) words[wi + 1] |= static_cast<u64>(v) >> (64 - sh);
    }
};

inline void punch_hole(int fd, u64 bytes, u64 offset);

// T = 0 s1 0 s2 ... 0 sk; R[i] = T[n - 1 - i]. Read straight from the caller's token ids and lengths (any
// integer dtype, possibly memory-mapped: a read-only map gives its pages back as it is read). `consume_fd`
// (>= 0): the file the ids are mapped from (from its start), a scratch file whose disk is given back as it is
// read (the text is all the build needs of it).
template <typename F, typename Len>
void fill_reversed(const F* flat, u64 tokens, const Len* lengths, u64 k, const int32_t* t2s, u64 vocab, PackedText& out, u64 n, bool drop,
                   int consume_fd) {
    u64 pos = 0, f = 0, dropped = 0;
    constexpr u64 kDropEvery = (4u << 20) / sizeof(F);
    for (u64 s = 0; s < k; ++s) {
        if (drop && f - dropped >= kDropEvery) {
            drop_mapped(flat + dropped, flat + f);
            punch_hole(consume_fd, (f - dropped) * sizeof(F), dropped * sizeof(F));
            dropped = f;
        }
        out.set(n - 1 - pos, 1);  // separator
        ++pos;
        const int64_t len = static_cast<int64_t>(lengths[s]);
        if (len < 0 || f + static_cast<u64>(len) > tokens) throw std::invalid_argument("lengths exceed the token ids");
        if ((s & 0xFFFF) == 0) check_cancel();
        for (int64_t j = 0; j < len; ++j, ++f, ++pos) {
            const int64_t t = static_cast<int64_t>(flat[f]);
            if (t < 0 || static_cast<u64>(t) >= vocab || t2s[t] <= 0) throw std::invalid_argument("token id without a symbol");
            out.set(n - 1 - pos, static_cast<u32>(t2s[t]) + 1);
        }
    }
    if (f != tokens) throw std::invalid_argument("lengths do not add up to the token ids");
    if (drop) {
        drop_mapped(flat + dropped, flat + tokens);
        punch_hole(consume_fd, (tokens - dropped) * sizeof(F), dropped * sizeof(F));
    }
}

// fn(pointer, count) over the token ids in their own integer type.
template <typename Fn>
void with_tokens(const py::array& flat, Fn fn) {
    const char kind = flat.dtype().kind();
    const auto size = flat.itemsize();
    const u64 tokens = static_cast<u64>(flat.size());
    const void* d = flat.data();
    if ((kind == 'i' || kind == 'u') && size == 8) fn(static_cast<const int64_t*>(d), tokens);
    else if (kind == 'u' && size == 4) fn(static_cast<const u32*>(d), tokens);
    else if (kind == 'i' && size == 4) fn(static_cast<const int32_t*>(d), tokens);
    else if (kind == 'u' && size == 2) fn(static_cast<const uint16_t*>(d), tokens);
    else throw std::invalid_argument("token ids must be 16, 32 or 64-bit integers");
}

// fn(pointer, count) over the sequence lengths in their own integer type.
template <typename Fn>
void with_lengths(const py::array& lengths, Fn fn) {
    const char kind = lengths.dtype().kind();
    const u64 k = static_cast<u64>(lengths.size());
    const void* d = lengths.data();
    if ((kind == 'i' || kind == 'u') && lengths.itemsize() == 8) fn(static_cast<const int64_t*>(d), k);
    else if (kind == 'u' && lengths.itemsize() == 4) fn(static_cast<const u32*>(d), k);
    else if (kind == 'i' && lengths.itemsize() == 4) fn(static_cast<const int32_t*>(d), k);
    else throw std::invalid_argument("lengths must be 32 or 64-bit integers");
}

// The dense alphabet of the token ids (the text's bits and the wavelet matrix's depth follow the symbols that
// occur, not the vocabulary): tok2sym [max id + 1] (-1 where absent, else 1, 2, ... in id order) and sym2tok
// [sigma] (0: the separator).
py::tuple dense_alphabet(py::array flat, bool drop_pages) {
    if (!(flat.flags() & py::array::c_style)) throw std::invalid_argument("token ids must be contiguous");
    std::vector<uint8_t> present;
    {
        py::gil_scoped_release release;
        with_tokens(flat, [&](const auto* ids, u64 tokens) {
            constexpr u64 kDropEvery = (4u << 20) / sizeof(*ids);
            for (u64 i = 0; i < tokens; ++i) {
                if ((i & kCancelEvery) == 0) check_cancel();
                const int64_t t = static_cast<int64_t>(ids[i]);
                if (t < 0) throw std::invalid_argument("token ids must be non-negative");
                if (static_cast<u64>(t) >= present.size()) present.resize(std::max<u64>(t + 1, 2 * present.size()), 0);
                present[t] = 1;
                if (drop_pages && i % kDropEvery == kDropEvery - 1) drop_mapped(ids + i + 1 - kDropEvery, ids + i + 1);
            }
            if (drop_pages) drop_mapped(ids + tokens / kDropEvery * kDropEvery, ids + tokens);
        });
    }
    while (!present.empty() && !present.back()) present.pop_back();
    py::array_t<int32_t> tok2sym(present.size());
    int32_t* t2s = tok2sym.mutable_data();
    u64 sigma = 1;
    for (size_t t = 0; t < present.size(); ++t) t2s[t] = present[t] ? static_cast<int32_t>(sigma++) : -1;
    py::array_t<u32> sym2tok(sigma);
    u32* s2t = sym2tok.mutable_data();
    s2t[0] = 0;
    for (size_t t = 0; t < present.size(); ++t)
        if (present[t]) s2t[t2s[t]] = static_cast<u32>(t);
    return py::make_tuple(tok2sym, sym2tok);
}

void fill_text(const py::array& flat, const py::array& lengths, const int32_t* t2s, u64 vocab, PackedText& out, u64 n, bool drop, int consume_fd) {
    with_tokens(flat, [&](const auto* ids, u64 tokens) {
        with_lengths(lengths, [&](const auto* lens, u64 k) { fill_reversed(ids, tokens, lens, k, t2s, vocab, out, n, drop, consume_fd); });
    });
}

// SA-IS (Nong, Zhang and Chan 2009) over an integer text s[0..n) in [0, K] with s[n-1] = 0 the unique
// smallest symbol. SA needs n entries; the reduced problem is solved inside SA. Memory: SA, the text, one
// type bit per symbol and K + 1 bucket counters.
template <typename Idx>
struct Sais {
    std::vector<uint8_t> tbits;
    inline bool stype(Idx i) const { return (tbits[static_cast<u64>(i) >> 3] >> (i & 7)) & 1; }
    inline void set_type(Idx i, bool b) {
        if (b) tbits[static_cast<u64>(i) >> 3] |= static_cast<uint8_t>(1u << (i & 7));
        else tbits[static_cast<u64>(i) >> 3] &= static_cast<uint8_t>(~(1u << (i & 7)));
    }
    inline bool lms(Idx i) const { return i > 0 && stype(i) && !stype(i - 1); }
};

template <typename Idx, typename Text>
void sais_buckets(const Text& s, Idx n, Idx K, Idx* bkt, bool end) {
    std::fill(bkt, bkt + static_cast<size_t>(K) + 1, Idx(0));
    for (Idx i = 0; i < n; ++i) ++bkt[s[i]];
    Idx sum = 0;
    for (Idx i = 0; i <= K; ++i) {
        sum += bkt[i];
        bkt[i] = end ? sum : sum - bkt[i];
    }
}

template <typename Idx, typename Text>
void sais_induce(const Text& s, Idx* SA, Idx n, Idx K, Idx* bkt, const Sais<Idx>& ty) {
    sais_buckets(s, n, K, bkt, false);
    for (Idx i = 0; i < n; ++i) {
        const Idx j = SA[i] - 1;
        if (SA[i] > 0 && !ty.stype(j)) SA[bkt[s[j]]++] = j;
    }
    sais_buckets(s, n, K, bkt, true);
    for (Idx i = n - 1; i >= 0; --i) {
        const Idx j = SA[i] - 1;
        if (SA[i] > 0 && ty.stype(j)) SA[--bkt[s[j]]] = j;
    }
}

// `work`: free space the caller lends for the buckets (the recursion's alphabet can be as large as a third
// of the text: its counters go into the unused middle of the suffix array instead of new memory).
template <typename Idx, typename Text>
void sais(const Text& s, Idx* SA, Idx n, Idx K, Idx* work = nullptr, u64 work_len = 0) {
    if (n == 1) {
        SA[0] = 0;
        return;
    }
    Sais<Idx> ty;
    ty.tbits.assign(static_cast<size_t>(n) / 8 + 1, 0);
    ty.set_type(n - 1, true);
    ty.set_type(n - 2, false);
    for (Idx i = n - 3; i >= 0; --i) ty.set_type(i, s[i] < s[i + 1] || (s[i] == s[i + 1] && ty.stype(i + 1)));
    const bool lent = work != nullptr && work_len >= static_cast<u64>(K) + 1;
    std::vector<Idx> own;
    if (!lent) own.resize(static_cast<size_t>(K) + 1);
    Idx* bkt = lent ? work : own.data();
    check_cancel();
    sais_buckets(s, n, K, bkt, true);
    std::fill(SA, SA + n, Idx(-1));
    for (Idx i = 1; i < n; ++i)
        if (ty.lms(i)) SA[--bkt[s[i]]] = i;
    sais_induce(s, SA, n, K, bkt, ty);
    check_cancel();
    Idx n1 = 0;
    for (Idx i = 0; i < n; ++i)
        if (ty.lms(SA[i])) SA[n1++] = SA[i];
    std::fill(SA + n1, SA + n, Idx(-1));
    Idx name = 0, prev = -1;
    for (Idx i = 0; i < n1; ++i) {
        const Idx pos = SA[i];
        bool diff = false;
        for (Idx d = 0; d < n; ++d) {
            if (prev == -1 || s[pos + d] != s[prev + d] || ty.stype(pos + d) != ty.stype(prev + d)) {
                diff = true;
                break;
            } else if (d > 0 && (ty.lms(pos + d) || ty.lms(prev + d))) {
                break;
            }
        }
        if (diff) {
            ++name;
            prev = pos;
        }
        SA[n1 + pos / 2] = name - 1;
    }
    check_cancel();
    for (Idx i = n - 1, j = n - 1; i >= n1; --i)
        if (SA[i] >= 0) SA[j--] = SA[i];
    Idx* SA1 = SA;
    Idx* s1 = SA + n - n1;
    if (name < n1) {
        if (!lent) std::vector<Idx>().swap(own);
        // SA[n1, n - n1) is free while the reduced problem is solved in SA[0, n1) over s1 = SA[n - n1, n)
        const Idx* s1c = s1;
        sais<Idx, const Idx*>(s1c, SA1, n1, name - 1, SA + n1, static_cast<u64>(n - 2 * n1));
        if (!lent) own.resize(static_cast<size_t>(K) + 1);
        bkt = lent ? work : own.data();
    } else {
        for (Idx i = 0; i < n1; ++i) SA1[s1[i]] = i;
    }
    check_cancel();
    sais_buckets(s, n, K, bkt, true);
    for (Idx i = 1, j = 0; i < n; ++i)
        if (ty.lms(i)) s1[j++] = i;
    for (Idx i = 0; i < n1; ++i) SA1[i] = s1[SA1[i]];
    std::fill(SA + n1, SA + n, Idx(-1));
    for (Idx i = n1 - 1; i >= 0; --i) {
        const Idx j = SA[i];
        SA[i] = -1;
        SA[--bkt[s[j]]] = j;
    }
    sais_induce(s, SA, n, K, bkt, ty);
}

// ------------------------------------------------------------------ suffixes by (local string, tie)

template <typename T>
void release(std::vector<T>& v) {  // `v = {}` would keep the capacity
    std::vector<T>().swap(v);
}

struct Suffix {
    u64 key;  // the next symbols of its local string, the first most significant, zeros after the separator
    u32 pos;  // in R
    u32 tie;  // the rank of the blocks after its separator (while naming blocks: the block's number)
};

// As many whole symbols of a local string as fit in a key (64 / w), then the high bits of the next one in the
// bits left over; zeros after the separator. Equal keys that did not reach the separator are refined from
// the first symbol not held whole.
struct Keys {
    const PackedText& s;
    unsigned per_key, spare;
    explicit Keys(const PackedText& text) : s(text), per_key(64 / text.w), spare(64 - per_key * text.w) {}
    inline u64 at(u64 p) const {
        u64 k = 0;
        u32 c = 2;
        for (unsigned f = 0; f < per_key; ++f) {
            c = c <= 1 ? 0 : s[p + f];
            k = (k << s.w) | c;
        }
        if (spare) k = (k << spare) | (c <= 1 ? 0 : s[p + per_key] >> (s.w - spare));
        return k;
    }
    inline bool ended(u64 key) const { return ((key >> spare) & s.mask) <= 1; }  // the last whole symbol is the separator or padding
    inline u32 symbol(u64 key, unsigned d) const { return static_cast<u32>((key >> (spare + s.w * (per_key - 1 - d))) & s.mask); }  // d < per_key
};

// One most-significant-digit pass of radix_sort: a[0, m) permuted in place into the groups of its 11-bit digit
// below the bits all values share (American flag sort: each item swapped straight to its digit's place).
// end[d] is where digit d's group ends; returns the digit's shift, or -1 when all values are equal.
template <typename Field>
int digit_pass(Suffix* a, u64 m, Field field, u64 (&end)[2048]) {
    u64 diff = 0;
    for (u64 i = 1; i < m; ++i) diff |= static_cast<u64>(field(a[i]) ^ field(a[0]));
    if (!diff) return -1;
    const int shift = std::max(0, 63 - __builtin_clzll(diff) - 10);
    auto digit = [&](const Suffix& x) { return static_cast<u32>(static_cast<u64>(field(x)) >> shift) & 2047u; };
    u64 count[2048] = {0}, next[2048];
    for (u64 i = 0; i < m; ++i) ++count[digit(a[i])];
    for (u64 d = 0, sum = 0; d < 2048; ++d) {
        next[d] = sum;
        sum += count[d];
        end[d] = sum;
    }
    for (u64 d = 0; d < 2048; ++d)
        while (next[d] < end[d]) {
            Suffix x = a[next[d]];
            for (u32 e = digit(x); e != d; e = digit(x)) std::swap(x, a[next[e]++]);
            a[next[d]++] = x;
        }
    return shift;
}

// Sorts a[0, m) by field(x) (an unsigned integer): digit passes, small groups by comparison.
template <typename Field>
void radix_sort(Suffix* a, u64 m, Field field) {
    if (m < 192) {
        std::sort(a, a + m, [&](const Suffix& x, const Suffix& y) { return field(x) < field(y); });
        return;
    }
    u64 end[2048];
    if (digit_pass(a, m, field, end) <= 0) return;
    for (u64 d = 0, lo = 0; d < 2048; lo = end[d++])
        if (end[d] - lo > 1) radix_sort(a + lo, end[d] - lo, field);
}

struct ByKey {
    u64 operator()(const Suffix& x) const { return x.key; }
};
struct ByTie {
    u32 operator()(const Suffix& x) const { return x.tie; }
};

// Sorts a[lo, hi) by (local string, tie), the keys holding the local strings from `depth` on. `same[i]` (when
// given, zeros) is set when a[i]'s local string equals a[i - 1]'s.
void sort_suffixes(Suffix* a, u64 lo, u64 hi, u64 depth, const Keys& keys, std::vector<uint8_t>* same) {
    struct Range {
        u64 lo, hi, depth;
    };
    std::vector<Range> todo{{lo, hi, depth}};
    while (!todo.empty()) {
        check_cancel();
        const Range r = todo.back();
        todo.pop_back();
        radix_sort(a + r.lo, r.hi - r.lo, ByKey{});
        for (u64 i = r.lo, j; i < r.hi; i = j) {
            for (j = i + 1; j < r.hi && a[j].key == a[i].key;) ++j;
            if (j - i == 1) continue;
            if (keys.ended(a[i].key)) {  // equal local strings: the blocks after them decide
                radix_sort(a + i, j - i, ByTie{});
                if (same) std::fill(same->begin() + static_cast<std::ptrdiff_t>(i) + 1, same->begin() + static_cast<std::ptrdiff_t>(j), 1);
            } else {
                const u64 d = r.depth + keys.per_key;
                for (u64 t = i; t < j; ++t) {
                    if (t + 8 < j) keys.s.prefetch(a[t + 8].pos + d);  // the refills read the text at random
                    a[t].key = keys.at(a[t].pos + d);
                }
                todo.push_back({i, j, d});
            }
        }
    }
}

// first() here and second() on a thread of its own; an exception in either is rethrown after both ended.
template <typename F, typename G>
void in_parallel(F first, G second) {
    std::exception_ptr failed;
    std::thread other([&] {
        try {
            second();
        } catch (...) {
            failed = std::current_exception();
        }
    });
    try {
        first();
    } catch (...) {
        other.join();
        throw;
    }
    other.join();
    if (failed) std::rethrow_exception(failed);
}

constexpr u64 kParallelItems = 1 << 15;  // from this many suffixes, a bucket is sorted by two threads

// A bucket's sort: after the first digit pass, the two halves (split at a digit boundary, so no equal keys
// straddle it) are sorted by two threads.
void sort_bucket_items(Suffix* a, u64 m, u64 depth, const Keys& keys, std::vector<uint8_t>* same) {
    u64 end[2048];
    if (m < kParallelItems || digit_pass(a, m, ByKey{}, end) < 0) return sort_suffixes(a, 0, m, depth, keys, same);
    u64 mid = 0;
    for (u64 d = 0; d < 2048 && 2 * end[d] <= m; ++d) mid = end[d];
    if (mid == 0) mid = end[std::find_if(end, end + 2048, [](u64 e) { return e > 0; }) - end];
    in_parallel([&] { sort_suffixes(a, 0, mid, depth, keys, same); }, [&] { sort_suffixes(a, mid, m, depth, keys, same); });
}

inline void punch_hole(int fd, u64 bytes, u64 offset) {
#ifdef FALLOC_FL_PUNCH_HOLE
    if (fd >= 0 && bytes) (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(bytes));
#else
    (void)fd, (void)bytes, (void)offset;
#endif
}

// The disk the build's scratch files take at most, as the file system counts it (allocated blocks), sampled
// between buckets: the files a build has open register here (one build per thread).
struct ScratchMeter {
    std::vector<int> fds;
    u64 peak = 0;
    void sample() {
        u64 total = 0;
        struct stat st;
        for (int fd : fds)
            if (::fstat(fd, &st) == 0) total += static_cast<u64>(st.st_blocks) * 512;
        peak = std::max(peak, total);
    }
    void add(int fd) { fds.push_back(fd); }
    void remove(int fd) { fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end()); }
};
thread_local ScratchMeter g_scratch;

// A scratch file of the build, removed when done: what would otherwise be held in memory goes through it
// (its pages are the page cache's, not this process's).
class ScratchFile {
   public:
    explicit ScratchFile(std::string path) : path_(std::move(path)), fd_(::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600)) {
        if (fd_ < 0) throw std::runtime_error("cannot create the scratch file " + path_);
        g_scratch.add(fd_);
    }
    ~ScratchFile() {
        g_scratch.sample();
        g_scratch.remove(fd_);
        ::close(fd_);
        ::unlink(path_.c_str());
    }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;
    void write_at(const void* data, u64 bytes, u64 offset) {
        for (const char* p = static_cast<const char*>(data); bytes;) {
            const ssize_t done = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
            if (done <= 0) throw std::runtime_error("cannot write the scratch file " + path_ + " (disk full?)");
            p += done, bytes -= done, offset += done;
        }
    }
    void read_at(void* data, u64 bytes, u64 offset) const {
        for (char* p = static_cast<char*>(data); bytes;) {
            const ssize_t done = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
            if (done <= 0) throw std::runtime_error("cannot read the scratch file " + path_);
            p += done, bytes -= done, offset += done;
        }
    }

    // The disk blocks of [offset, offset + bytes) go back to the file system (read as zeros afterwards): what a
    // build has consumed stops counting against its scratch disk. Where the file system cannot, nothing happens.
    void release(u64 bytes, u64 offset) { punch_hole(fd_, bytes, offset); }

   private:
    std::string path_;
    int fd_;
};

// Sorts the suffixes of s (every position and the empty suffix, or only the blocks' first positions) by
// (local string, tie) in buckets of at most `max_items`, handed to emit() in suffix order. One pass over the
// text routes every suffix to the bucket of its first symbol (a range of symbols, or one symbol when it alone
// has too many suffixes) in a scratch file. A bucket that is too big is split the same way by its next symbol,
// from the file, and one whose local strings all end there by ranges of ties.
// The file holds positions alone (4 bytes a suffix): a bucket's keys and ties are computed again when it is
// loaded (its positions ascend, so the block of each is found by a short search forward), and the disk of what
// has been loaded or split is given back, so the file never holds much more than the suffixes still unsorted.
class BucketSorter {
   public:
    using Tie = std::function<u32(u64 pos, u64 block)>;
    BucketSorter(const PackedText& s, u64 n, u64 sigma, u64 max_items, bool block_starts, u64 ties, const std::string& scratch, Tie tie_of)
        : s_(s), keys_(s), n_(n), sigma_(sigma), max_items_(std::max<u64>(max_items, 1)), starts_(block_starts), ties_(ties), file_(scratch),
          tie_of_(std::move(tie_of)) {
        for (u64 p = 0; p < n_; ++p) {  // where the separators are: the block of a position is how many come before it
            if ((p & kCancelEvery) == 0) check_cancel();
            if (s_[p] == 1) seps_.push_back(static_cast<u32>(p));
        }
    }

    template <typename Emit>
    void run(bool want_same, Emit emit) {
        std::vector<u32> counts(sigma_ + 1, 0);  // n < 2^31
        scan([&](u64, u32 c) { ++counts[c]; });
        Split root = split_by_symbol(counts, 0);
        release(counts);
        scan([&](u64 p, u32 c) { root.add(c, static_cast<u32>(p)); });
        root.finish();
        std::vector<Suffix> items;
        std::vector<uint8_t> same;
        for (Bucket& bk : root.buckets) sort_bucket(bk, want_same, false, items, same, emit);
    }

   private:
    static constexpr u64 kBufferBytes = 512 << 10;  // a split's write buffers together, and a bucket's read chunk
    // Pieces start at whole file-system blocks and a read chunk covers whole blocks: giving back a read range
    // frees its blocks (a range that only covers parts of blocks would free none of them).
    static constexpr u64 kAlign = 4096 / sizeof(u32);
    static constexpr u64 align_up(u64 x) { return (x + kAlign - 1) / kAlign * kAlign; }

    struct Piece {
        u64 offset, count;  // in positions
    };
    // Suffixes that share their first `depth` symbols (all of their local string when `ended`).
    struct Bucket {
        std::vector<Piece> pieces;
        u64 count = 0;
        u32 depth = 0;
        bool ended = false;
    };
    // Routes positions by a digit (a symbol: its bucket in `of_symbol`; a tie: ranges of `tie_width`) to
    // buckets, through one write buffer per bucket.
    struct Split {
        BucketSorter* owner;
        std::vector<u32> of_symbol;
        u64 tie_width = 0;
        std::vector<Bucket> buckets;
        std::vector<u32> buf;
        std::vector<u64> used;
        u64 per = 0;

        void open() {
            per = std::max<u64>(kAlign, kBufferBytes / sizeof(u32) / buckets.size() / kAlign * kAlign);
            buf.resize(per * buckets.size());
            used.assign(buckets.size(), 0);
        }
        inline void add(u32 digit, u32 pos) {
            const u64 i = tie_width ? digit / tie_width : of_symbol[digit];
            buf[i * per + used[i]++] = pos;
            if (used[i] == per) flush(i);
        }
        void flush(u64 i) {
            buckets[i].pieces.push_back(owner->append(buf.data() + i * per, used[i]));
            buckets[i].count += used[i];
            used[i] = 0;
        }
        void finish() {
            for (u64 i = 0; i < buckets.size(); ++i)
                if (used[i]) flush(i);
            release(buf);
            release(used);
            release(of_symbol);
        }
    };

    Piece append(const u32* a, u64 count) {
        const u64 at = end_;
        file_.write_at(a, count * sizeof(u32), at * sizeof(u32));
        end_ = align_up(at + count);
        return {at, count};
    }

    // Buckets of the symbol at `depth`: ranges of symbols up to max_items suffixes, one symbol alone when more.
    Split split_by_symbol(const std::vector<u32>& counts, u32 depth) {
        Split sp{this, std::vector<u32>(sigma_ + 1, 0), 0, {}, {}, {}, 0};
        u64 sum = 0;
        for (u32 c = 0; c <= sigma_; ++c) {
            const u64 x = counts[c];
            if (!x) continue;
            const bool heavy = x > max_items_;
            if (sp.buckets.empty() || heavy || sum + x > max_items_) {
                sp.buckets.push_back(Bucket{{}, 0, heavy ? depth + 1 : depth, heavy && c <= 1});
                sum = 0;
            }
            sp.of_symbol[c] = static_cast<u32>(sp.buckets.size() - 1);
            sum += x;
            if (heavy) sum = max_items_;  // nothing joins a heavy symbol's bucket
        }
        sp.open();
        return sp;
    }

    // The block of position p: how many separators come before it. `at` is where the search starts (positions
    // asked in ascending order move it forward a little each time); it is left at the answer.
    inline u64 block_of(u64 p, u64& at) const {
        if (at > 0 && seps_[at - 1] >= p) at = 0;  // not ascending (never in a bucket): search from the start
        u64 step = 1, hi = at;
        while (hi < seps_.size() && seps_[hi] < p) {  // gallop, then bisect
            at = hi + 1;
            hi = at + step;
            step *= 2;
        }
        at = static_cast<u64>(std::lower_bound(seps_.begin() + static_cast<std::ptrdiff_t>(at),
                                               seps_.begin() + static_cast<std::ptrdiff_t>(std::min<u64>(hi, seps_.size())), static_cast<u32>(p)) -
                              seps_.begin());
        return at;
    }

    // fn(pos) for every position of the bucket, in file order (ascending); `consume`: each chunk's disk is given
    // back once read. `ahead` (the split passes, which read the symbol at the bucket's depth at random): the text
    // there is prefetched a few positions ahead.
    template <typename Fn>
    void for_each_pos(const Bucket& bk, bool consume, Fn fn, bool ahead = false) {
        std::vector<u32> chunk(std::min<u64>(bk.count, kBufferBytes / sizeof(u32)));
        for (const Piece& pc : bk.pieces)
            for (u64 done = 0; done < pc.count;) {
                const u64 m = std::min<u64>(chunk.size(), pc.count - done);
                check_cancel();
                file_.read_at(chunk.data(), m * sizeof(u32), (pc.offset + done) * sizeof(u32));
                if (consume) file_.release((done + m == pc.count ? align_up(pc.count) - done : m) * sizeof(u32), (pc.offset + done) * sizeof(u32));
                if (ahead)
                    for (u64 i = 0; i < m; ++i) {
                        if (i + 16 < m) s_.prefetch(chunk[i + 16] + bk.depth);
                        fn(chunk[i]);
                    }
                else
                    for (u64 i = 0; i < m; ++i) fn(chunk[i]);
                done += m;
            }
    }

    // `continued`: its first local string equals the last one emitted (a tie range after the first)
    template <typename Emit>
    void sort_bucket(const Bucket& bk, bool want_same, bool continued, std::vector<Suffix>& items, std::vector<uint8_t>& same, Emit& emit) {
        check_cancel();
        g_scratch.sample();
        if (bk.count <= max_items_) {
            if (bk.count > items.capacity()) {  // exactly this many, the old buffer freed first
                std::vector<Suffix>().swap(items);
                items.reserve(bk.count);
            }
            items.resize(bk.count);
            // the keys from the bucket's depth on (the symbols before are shared; an ended bucket's local
            // strings are equal: one key, the ties decide)
            u64 i = 0, at = 0;
            for_each_pos(bk, true, [&](u32 p) { items[i++] = Suffix{0, p, tie_of_(p, block_of(p, at))}; });
            if (!bk.ended)
                for (u64 t = 0; t < items.size(); ++t) {
                    if (t + 16 < items.size()) s_.prefetch(items[t + 16].pos + bk.depth);
                    items[t].key = keys_.at(items[t].pos + bk.depth);
                }
            if (want_same) same.assign(items.size(), 0);
            sort_bucket_items(items.data(), items.size(), bk.ended ? 0 : bk.depth, keys_, want_same ? &same : nullptr);
            if (want_same && continued) same[0] = 1;
            emit(items, same);
            return;
        }
        Split sub{this, {}, 0, {}, {}, {}, 0};
        if (bk.ended) {  // equal local strings, distinct ties: ranges of ties hold at most max_items each
            sub.tie_width = max_items_;
            sub.buckets.resize((ties_ + max_items_ - 1) / max_items_, Bucket{{}, 0, bk.depth, true});
            sub.open();
            u64 at = 0;
            for_each_pos(bk, true, [&](u32 p) { sub.add(tie_of_(p, block_of(p, at)), p); });
        } else {
            // the bucket's local strings go on past its depth (no separator among the shared symbols)
            std::vector<u32> counts(sigma_ + 1, 0);
            for_each_pos(bk, false, [&](u32 p) { ++counts[s_[p + bk.depth]]; }, true);
            const auto first_used = std::find_if(counts.begin(), counts.end(), [](u32 x) { return x > 0; });
            if (*first_used == bk.count) {  // one next symbol for all: the same bucket, one symbol deeper
                Bucket deeper = bk;
                deeper.depth += 1;
                deeper.ended = first_used - counts.begin() <= 1;
                release(counts);
                sort_bucket(deeper, want_same, continued, items, same, emit);
                return;
            }
            sub = split_by_symbol(counts, bk.depth);
            for_each_pos(bk, true, [&](u32 p) { sub.add(s_[p + bk.depth], p); }, true);
        }
        sub.finish();
        bool first = true;
        for (const Bucket& child : sub.buckets)
            if (child.count) {
                sort_bucket(child, want_same, continued || (bk.ended && !first), items, same, emit);
                first = false;
            }
    }

    // fn(p, s[p]) for every position p in [0, n] (the empty suffix included), or every block start
    template <typename Fn>
    void scan(Fn fn) const {
        bool start = true;
        for (u64 p = 0; p <= n_; ++p) {
            if ((p & kCancelEvery) == 0) check_cancel();
            const u32 c = s_[p];
            if (!starts_ || (start && p < n_)) fn(p, c);
            start = c == 1;
        }
    }

    const PackedText& s_;
    Keys keys_;
    u64 n_, sigma_, max_items_;
    bool starts_;
    u64 ties_;  // ties are below this
    ScratchFile file_;
    Tie tie_of_;
    std::vector<u32> seps_;  // the positions of the separators, ascending
    u64 end_ = 0;            // positions written to the file
};

// The rank of every block's whole suffix, as the tie of the block before it: ties[b] = rank of block b + 1's
// suffix among the blocks' suffixes and the empty one (rank 0, after the last block). The blocks' local
// strings are named by their sorted order; the blocks' suffixes sort as the suffixes of that name sequence.
std::vector<int32_t> block_ties(const PackedText& s, u64 n, u64 k, u64 sigma, u64 max_items, const std::string& scratch) {
    if (k + 1 >= (1ULL << 31)) throw std::invalid_argument("too many sequences");
    std::vector<int32_t> names(k + 1, 0);  // names[k] = 0: the empty suffix
    int32_t name = 0;
    BucketSorter(s, n, sigma, max_items, true, k, scratch, [](u64, u64 b) { return static_cast<u32>(b); })
        .run(true, [&](const std::vector<Suffix>& a, const std::vector<uint8_t>& same) {
            for (size_t i = 0; i < a.size(); ++i) {
                name += !same[i];
                names[a[i].tie] = name;
            }
        });
    {
        std::vector<int32_t> sa(k + 1);
        const int32_t* text = names.data();
        sais<int32_t, const int32_t*>(text, sa.data(), static_cast<int32_t>(k + 1), name);
        for (u64 r = 0; r <= k; ++r) names[sa[r]] = static_cast<int32_t>(r);  // names becomes the inverse
    }
    names.erase(names.begin());  // ties[b] = rank of the suffix at block b + 1
    return names;
}

// Huffman shape: code lengths from the symbol counts (at most kMaxCode bits), then codes assigned level by
// level so that, in the wavelet matrix's order at each level (the bits read so far, latest bit most
// significant), the codes that end there are the largest. The symbols that end at a level then form the tail
// of the next level's order and are cut off: level l holds only the symbols whose code is longer than l.
// Returns (codes [sigma] u32, MSB = first level; code_lens [sigma] u8; tree [internal][2] i32: a child >= 0 is
// an internal node, < 0 the leaf of symbol -child - 1).
constexpr int kMaxCode = 32;

std::vector<int> huffman_lengths(const std::vector<u64>& freq) {
    const size_t m = freq.size();
    std::vector<int> len(m, 0);
    if (m <= 1) return len;
    std::vector<u32> order(m);
    for (size_t i = 0; i < m; ++i) order[i] = static_cast<u32>(i);
    std::sort(order.begin(), order.end(), [&](u32 x, u32 y) { return freq[x] < freq[y] || (freq[x] == freq[y] && x < y); });
    // two-queue Huffman: leaves in order, internal nodes in creation order (non-decreasing weights)
    std::vector<u64> w(2 * m - 1);
    std::vector<u32> parent(2 * m - 1, 0);
    for (size_t i = 0; i < m; ++i) w[i] = freq[order[i]];
    size_t li = 0, ii = m, next = m;
    auto take = [&]() -> size_t {
        if (li < m && (ii >= next || w[li] <= w[ii])) return li++;
        return ii++;
    };
    while (next < 2 * m - 1) {
        const size_t x = take(), y = take();
        w[next] = w[x] + w[y];
        parent[x] = parent[y] = static_cast<u32>(next);
        ++next;
    }
    std::vector<int> depth(2 * m - 1, 0);
    for (size_t i = 2 * m - 2; i-- > 0;) depth[i] = depth[parent[i]] + 1;
    for (size_t i = 0; i < m; ++i) len[order[i]] = depth[i];
    return len;
}

inline u32 reverse_bits(u32 code, int d) {
    u32 r = 0;
    for (int i = 0; i < d; ++i) r |= ((code >> i) & 1u) << (d - 1 - i);
    return r;
}

py::tuple huffman_codes(py::array_t<int64_t, py::array::c_style | py::array::forcecast> counts) {
    const u64 sigma = static_cast<u64>(counts.size());
    std::vector<u64> freq(sigma);
    for (u64 c = 0; c < sigma; ++c) freq[c] = std::max<int64_t>(counts.data()[c], 1);
    std::vector<int> len = huffman_lengths(freq);
    for (u64 floor = 2; *std::max_element(len.begin(), len.end()) > kMaxCode; floor *= 2) {
        for (auto& f : freq) f = std::max<u64>(f, floor);  // flatten the rarest until the codes fit
        len = huffman_lengths(freq);
    }
    const int maxlen = sigma ? *std::max_element(len.begin(), len.end()) : 0;
    std::vector<std::vector<u32>> by_len(maxlen + 1);
    for (u64 c = 0; c < sigma; ++c) by_len[len[c]].push_back(static_cast<u32>(c));
    py::array_t<u32> codes(sigma);
    py::array_t<uint8_t> lens(sigma);
    u32* co = codes.mutable_data();
    uint8_t* le = lens.mutable_data();
    std::fill(co, co + sigma, 0u);
    std::fill(le, le + sigma, 0);
    std::vector<int32_t> tree;  // [internal][2]
    if (maxlen > 0) {
        // internal nodes at the current depth: (code, node id)
        std::vector<std::pair<u32, int32_t>> internal{{0u, 0}};
        tree.assign(2, 0);
        for (int d = 1; d <= maxlen; ++d) {
            std::vector<std::tuple<u32, u32, int32_t, int>> nodes;  // (key, code, parent, bit)
            for (auto& [code, id] : internal)
                for (int bit = 0; bit < 2; ++bit) {
                    const u32 c2 = (code << 1) | static_cast<u32>(bit);
                    nodes.emplace_back(reverse_bits(c2, d), c2, id, bit);
                }
            std::sort(nodes.begin(), nodes.end());
            const auto& leaves = by_len[d];
            if (leaves.size() > nodes.size()) throw std::runtime_error("huffman: bad code lengths");
            const size_t n_int = nodes.size() - leaves.size();
            std::vector<std::pair<u32, int32_t>> next_internal;
            for (size_t i = 0; i < nodes.size(); ++i) {
                const auto& [key, c2, par, bit] = nodes[i];
                if (i < n_int) {
                    const int32_t id = static_cast<int32_t>(tree.size() / 2);
                    tree.push_back(0);
                    tree.push_back(0);
                    tree[2 * par + bit] = id;
                    next_internal.emplace_back(c2, id);
                } else {
                    const u32 sym = leaves[i - n_int];
                    tree[2 * par + bit] = -static_cast<int32_t>(sym) - 1;
                    co[sym] = c2;
                    le[sym] = static_cast<uint8_t>(d);
                }
            }
            internal.swap(next_internal);
        }
        if (!internal.empty()) throw std::runtime_error("huffman: incomplete code tree");
    }
    py::array_t<int32_t> tr({static_cast<py::ssize_t>(tree.size() / 2), static_cast<py::ssize_t>(2)});
    std::copy(tree.begin(), tree.end(), tr.mutable_data());
    return py::make_tuple(codes, lens, tr);
}

// ------------------------------------------------------------------ the build

constexpr u64 kParallelRows = 1 << 20;  // from this many rows, two threads fill the wavelet matrix

// The BWT symbols, written in row order and read back once.
class Spill {
   public:
    explicit Spill(const std::string& path) : file_(path) { buf_.reserve(kChunk); }
    inline void put(u32 v) {
        buf_.push_back(v);
        if (buf_.size() == kChunk) flush();
    }
    void flush() {
        file_.write_at(buf_.data(), buf_.size() * sizeof(u32), written_ * sizeof(u32));
        written_ += buf_.size();
        buf_.clear();
    }
    size_t read(u64 from, u32* out, size_t max) const {
        const size_t m = static_cast<size_t>(std::min<u64>(max, written_ - from));
        file_.read_at(out, m * sizeof(u32), from * sizeof(u32));
        return m;
    }
    static constexpr size_t kChunk = 1 << 16;

   private:
    ScratchFile file_;
    std::vector<u32> buf_;
    u64 written_ = 0;
};

// Fills the Huffman-shaped wavelet matrix from the BWT in `spill` in one pass. Level l holds the symbols whose
// code is longer than l, in the order of the code tree's internal nodes at depth l (huffman_codes numbers
// them in that order), each node's symbols in BWT order: a symbol's place at a level is its node's next slot.
py::tuple fill_wavelet(Spill& spill, u64 rows, const std::vector<u32>& bwt_counts, const py::tuple& huffman) {
    const auto codes = huffman[0].cast<py::array_t<u32, py::array::c_style>>();
    const auto lens = huffman[1].cast<py::array_t<uint8_t, py::array::c_style>>();
    const auto tree_a = huffman[2].cast<py::array_t<int32_t, py::array::c_style>>();
    const u32* co = codes.data();
    const uint8_t* le = lens.data();
    const int32_t* tree = tree_a.data();
    const u64 sigma = static_cast<u64>(codes.size());
    const u64 inner = static_cast<u64>(tree_a.shape(0));
    int L = 0;
    for (u64 c = 0; c < sigma; ++c) L = std::max<int>(L, le[c]);
    std::vector<int> depth(inner, 0);
    std::vector<u64> size(inner, 0), next(inner, 0);
    for (u64 v = 0; v < inner; ++v)
        for (int bit = 0; bit < 2; ++bit)
            if (tree[2 * v + bit] >= 0) depth[tree[2 * v + bit]] = depth[v] + 1;
    for (u64 c = 0; c < sigma; ++c) {
        int32_t v = 0;
        for (int l = 0; l < le[c]; ++l) {
            size[v] += bwt_counts[c];
            const int32_t child = tree[2 * v + ((co[c] >> (le[c] - 1 - l)) & 1)];
            if (l + 1 < le[c]) v = child;
        }
    }
    std::vector<u64> sizes(L, 0);
    for (u64 v = 0; v < inner; ++v) {  // ids ascend through the depths, and within a depth in level order
        next[v] = sizes[depth[v]];
        sizes[depth[v]] += size[v];
    }
    if (L > 0 && sizes[0] != rows) throw std::runtime_error("wavelet matrix: level 0 does not hold every row");
    std::vector<u64> word_at(L + 1, 0), idx_at(L + 1, 0);
    for (int l = 0; l < L; ++l) {
        word_at[l + 1] = word_at[l] + blocks_for(sizes[l]) * kBlockWords;
        idx_at[l + 1] = idx_at[l] + blocks_for(sizes[l]);
    }
    py::array_t<u64> levels(std::max<u64>(word_at[L], 1));
    py::array_t<u64> levels_idx(std::max<u64>(idx_at[L], 1));
    py::array_t<u64> level_sizes(L);
    py::array_t<u64> zeros(L);
    u64* lv = levels.mutable_data();
    u64* lvi = levels_idx.mutable_data();
    u64* z = zeros.mutable_data();
    std::copy(sizes.begin(), sizes.end(), level_sizes.mutable_data());
    {
        py::gil_scoped_release release;
        std::fill(lv, lv + std::max<u64>(word_at[L], 1), 0ULL);
        std::fill(lvi, lvi + std::max<u64>(idx_at[L], 1), 0ULL);
        std::fill(z, z + L, 0ULL);
        for (u64 c = 0; c < sigma; ++c)
            for (int l = 0; l < le[c]; ++l) z[l] += ((co[c] >> (le[c] - 1 - l)) & 1) ? 0 : bwt_counts[c];
        spill.flush();
        // Levels [from, to): a chunk at a time, level by level (the few nodes of a level keep their write cursors
        // in cache), the chunk's symbols still coded below the level each with its node there.
        auto fill_levels = [&](int from, int to) {
            std::vector<int32_t> start(sigma, 0);  // each symbol's node at level `from`
            for (u64 c = 0; c < sigma; ++c)
                for (int l = 0; l < std::min<int>(from, le[c] - 1); ++l) start[c] = tree[2 * start[c] + ((co[c] >> (le[c] - 1 - l)) & 1)];
            std::vector<u32> chunk(Spill::kChunk);
            std::vector<std::pair<u32, int32_t>> live;
            live.reserve(chunk.size());
            u64 seen = 0;
            for (size_t got; (got = spill.read(seen, chunk.data(), chunk.size())) > 0; seen += got) {
                check_cancel();
                live.clear();
                for (size_t i = 0; i < got; ++i) {
                    if (chunk[i] >= sigma) throw std::runtime_error("wavelet matrix: symbol out of range");
                    if (le[chunk[i]] > from) live.emplace_back(chunk[i], start[chunk[i]]);
                }
                for (int l = from; l < to && !live.empty(); ++l) {
                    u64* words = lv + word_at[l];
                    size_t keep = 0;
                    for (const auto& [c, v] : live) {
                        const int len = le[c];
                        const u32 bit = (co[c] >> (len - 1 - l)) & 1;
                        const u64 at = next[v]++;
                        words[at >> 6] |= static_cast<u64>(bit) << (at & 63);
                        if (l + 1 < len) live[keep++] = {c, tree[2 * v + bit]};
                    }
                    live.resize(keep);
                }
            }
            if (seen != rows) throw std::runtime_error("scratch file: short read");
        };
        // A big matrix is filled by two threads, the top levels and the rest (about the same number of bits);
        // each reads the file itself, and the nodes, cursors and words of a level are only its own.
        int split = L;
        if (rows >= kParallelRows && L > 1) {
            u64 total = 0, upper = 0;
            for (int l = 0; l < L; ++l) total += sizes[l];
            for (split = 0; split < L - 1 && 2 * (upper + sizes[split]) <= total;) upper += sizes[split++];
            split = std::max(split, 1);
        }
        if (split < L) in_parallel([&] { fill_levels(0, split); }, [&] { fill_levels(split, L); });
        else fill_levels(0, L);
        for (int l = 0; l < L; ++l) finish_ranks(lv + word_at[l], lvi + idx_at[l], blocks_for(sizes[l]));
    }
    return py::make_tuple(levels, levels_idx, level_sizes, zeros);
}

// The FM-index arrays of T = 0 s1 0 s2 ... 0 sk from the token ids `flat`, `lengths` tokens per sequence and
// the dense symbol of each token id. `max_items` bounds a sorting bucket (16 bytes an item). `consume`: the path
// of the scratch file `flat` maps read-only from its start, whose disk is given back as it is read (the ids
// read as zeros afterwards), or "". Returns (levels,
// levels_idx, level_sizes, zeros, marks, marks_idx, samples, dollar_row, counts, codes, code_lens, tree, the peak
// bytes of scratch disk: the build's files and what was left of `consume`).
py::tuple build_fm(py::array flat, py::array lengths, py::array_t<int32_t, py::array::c_style> tok2sym, u64 sigma, u64 sample_rate,
                   u64 max_items, const std::string& scratch, bool drop_pages, const std::string& consume) {
    if (!(flat.flags() & py::array::c_style) || !(lengths.flags() & py::array::c_style)) throw std::invalid_argument("token ids and lengths must be contiguous");
    if (sample_rate == 0) throw std::invalid_argument("sample_rate must be positive");
    const u64 k = static_cast<u64>(lengths.size());
    const u64 n = static_cast<u64>(flat.size()) + k;
    if (k == 0) throw std::invalid_argument("no sequences");
    if (n + 1 >= (1ULL << 31)) throw std::invalid_argument("the FM-index builds up to 2^31 - 1 tokens and separators");
    int32_t max_sym = 0;
    for (py::ssize_t t = 0; t < tok2sym.size(); ++t) max_sym = std::max(max_sym, tok2sym.data()[t]);
    if (static_cast<u64>(max_sym) >= sigma) throw std::invalid_argument("tok2sym: symbol beyond sigma");
    const u64 rows = n + 1;
    const u64 nblocks = blocks_for(rows);
    py::array_t<u64> marks(nblocks * kBlockWords);
    py::array_t<u64> marks_idx(nblocks);
    py::array_t<int64_t> counts(sigma);
    u64* mk = marks.mutable_data();
    int64_t* cnt = counts.mutable_data();
    std::vector<u32> samples;
    std::vector<u32> bwt_counts(sigma, 0);  // n < 2^31
    u64 dollar_row = 0;
    g_scratch = ScratchMeter{};
    Spill spill(scratch + ".bwt");
    {
        py::gil_scoped_release release;
        unsigned w = 1;
        while ((1ULL << w) <= sigma) ++w;  // s holds 0 .. sigma
        PackedText s(rows, w);
        {
            const int fd = consume.empty() ? -1 : ::open(consume.c_str(), O_RDWR);  // cannot: its disk is kept, no harm
            if (fd >= 0) g_scratch.add(fd);
            g_scratch.sample();
            try {
                fill_text(flat, lengths, tok2sym.data(), static_cast<u64>(tok2sym.size()), s, n, drop_pages, drop_pages ? fd : -1);
            } catch (...) {
                if (fd >= 0) g_scratch.remove(fd), ::close(fd);
                throw;
            }
            g_scratch.sample();
            if (fd >= 0) g_scratch.remove(fd), ::close(fd);  // what is left of it counts no more: the caller removes it
        }
        const std::vector<int32_t> ties = block_ties(s, n, k, sigma, max_items, scratch + ".blocks");
        std::fill(mk, mk + nblocks * kBlockWords, 0ULL);
        std::fill(cnt, cnt + sigma, 0);
        for (u64 q = 0; q < n; ++q) ++cnt[s[q] - 1];
        samples.reserve(n / sample_rate + 2);
        u64 row = 0;
        BucketSorter(s, n, sigma, max_items, false, k + 1, scratch + ".suffixes", [&](u64 p, u64 b) { return p < n ? static_cast<u32>(ties[b]) : 0u; })
            .run(false, [&](const std::vector<Suffix>& a, const std::vector<uint8_t>&) {
                     for (size_t i = 0; i < a.size(); ++i) {
                         if (i + 48 < a.size() && a[i + 48].pos) s.prefetch(a[i + 48].pos - 1);  // the BWT symbols are read at random
                         const u64 q = a[i].pos;  // row 0: q = n, the empty suffix
                         if (q == 0) dollar_row = row;
                         if (q < n && q % sample_rate == 0) {
                             set_bit(mk, row);
                             samples.push_back(static_cast<u32>(q / sample_rate));
                         }
                         const u32 b = q ? s[q - 1] - 1 : 0;  // BWT over R: the symbol before; a stand-in 0 for the whole text
                         spill.put(b);
                         ++bwt_counts[b];
                         ++row;
                     }
                 });
        if (row != rows) throw std::runtime_error("suffix sorting lost rows");
        finish_ranks(mk, marks_idx.mutable_data(), nblocks);
    }  // the text is freed here, before the wavelet matrix is allocated
    const py::tuple huffman = huffman_codes(counts);
    const py::tuple wm = fill_wavelet(spill, rows, bwt_counts, huffman);
    g_scratch.sample();
    const u64 scratch_peak = g_scratch.peak;
    py::array_t<u32> samp(samples.size());
    std::copy(samples.begin(), samples.end(), samp.mutable_data());
    return py::make_tuple(wm[0], wm[1], wm[2], wm[3], marks, marks_idx, samp, dollar_row, counts, huffman[0], huffman[1], huffman[2], scratch_peak);
}
