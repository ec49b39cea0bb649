#include "collective/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradsync {
namespace {

int CeilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

int FloorLog2(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// Pieces of a pipelined chain (ring broadcast/reduce) with the default
// RingOptions: RingSegmentBytes = clamp(B/4, 64 KiB, 1 MiB).
double ChainSegments(double b) {
  const double seg = std::clamp(b / 4, 64.0 * 1024, 1024.0 * 1024);
  return std::max(1.0, std::ceil(b / seg));
}

// The rounds of the signature exchange every op starts with (algorithm.h).
double SignatureRounds(const LinkParams& link, int world) {
  if (link.signatures == SignaturePattern::kAllToAll) return 1;
  const int lp = FloorLog2(world);
  return lp + ((1 << lp) != world ? 2 : 0);
}

}  // namespace

double PredictMicros(CollectiveKind kind, Algorithm algo, size_t bytes, int world,
                     const LinkParams& link) {
  if (!Implements(algo, kind)) return std::numeric_limits<double>::infinity();
  if (world <= 1) return 0;
  if (bytes == 0 && kind != CollectiveKind::kBarrier) return 0;  // returns at once
  const double a = link.alpha_us, be = link.beta_us_per_byte, g = link.reduce_us_per_byte;
  const double n = world, B = static_cast<double>(bytes);
  const double L = CeilLog2(world);
  const int lp = FloorLog2(world);
  const double l = lp, p = static_cast<double>(1 << lp);
  const bool folded = (1 << lp) != world;  // non-power of two: fold in and out
  using A = Algorithm;
  switch (kind) {
    case CollectiveKind::kAllreduce:
      switch (algo) {
        case A::kRing:  // 2(n-1) steps of B/n: 2(n-1)a + 2(n-1)/n B b + (n-1)/n B g
          return 2 * (n - 1) * a + 2 * (n - 1) / n * B * be + (n - 1) / n * B * g;
        case A::kRecursiveHalvingDoubling: {
          // 2l a + 2(p-1)/p B b + (p-1)/p B g; folding adds 2a + 2B b + B g
          double t = 2 * l * a + 2 * (p - 1) / p * B * be + (p - 1) / p * B * g;
          if (folded) t += 2 * a + 2 * B * be + B * g;
          return t;
        }
        case A::kRecursiveDoubling: {
          // l (a + B b + B g); folding adds 2a + 2B b + B g
          double t = l * (a + B * be + B * g);
          if (folded) t += 2 * a + 2 * B * be + B * g;
          return t;
        }
        case A::kBinomialTree:  // reduce + broadcast: L(a + B b + B g) + L(a + B b)
          return L * (a + B * be + B * g) + L * (a + B * be);
        case A::kOneShot: {  // rides on the signature exchange: no latency term of its own
          if (bytes > kOneShotMaxBytes) break;
          const double burst = link.burst_us_per_byte > 0 ? link.burst_us_per_byte : be;
          if (link.signatures == SignaturePattern::kAllToAll) {
            return (n - 1) * B * (burst + g);  // every peer's B in, n-1 reductions
          }
          // recursive doubling: l rounds of B each way and a reduction;
          // folding adds B in (and reduced) and B out
          double t = l * B * (burst + g);
          if (folded) t += 2 * B * burst + B * g;
          return t;
        }
        default: break;
      }
      break;
    case CollectiveKind::kReduceScatter:
      switch (algo) {
        case A::kRing:  // (n-1) a + (n-1)/n B (b + g)
          return (n - 1) * a + (n - 1) / n * B * (be + g);
        case A::kRecursiveHalvingDoubling: {
          // l a + (p-1)/p B (b + g); folding adds a + B (b + g) + a + (B/n) b
          double t = l * a + (p - 1) / p * B * (be + g);
          if (folded) t += 2 * a + B * (be + g) + B / n * be;
          return t;
        }
        default: break;
      }
      break;
    case CollectiveKind::kAllgather:
      switch (algo) {
        case A::kRing:  // (n-1) a + (n-1)/n B b
          return (n - 1) * a + (n - 1) / n * B * be;
        case A::kRecursiveHalvingDoubling: {
          // l a + (p-1)/p B b; folding adds a + (B/n) b (one block in) and
          // 2a + (n-1)/n B b (every other block out, as two messages)
          double t = l * a + (p - 1) / p * B * be;
          if (folded) t += 3 * a + B / n * be + (n - 1) / n * B * be;
          return t;
        }
        case A::kRecursiveDoubling:  // Bruck: L a + (n-1)/n B b, no folding
          return L * a + (n - 1) / n * B * be;
        default: break;
      }
      break;
    case CollectiveKind::kBroadcast:
      switch (algo) {
        case A::kRing: {  // chain of S pieces: (n-2+S)(a + (B/S) b)
          const double s = ChainSegments(B);
          return (n - 2 + s) * (a + B / s * be);
        }
        case A::kBinomialTree:  // L (a + B b)
          return L * (a + B * be);
        default: break;
      }
      break;
    case CollectiveKind::kReduce:
      switch (algo) {
        case A::kRing: {  // chain of S pieces: (n-2+S)(a + (B/S)(b + g))
          const double s = ChainSegments(B);
          return (n - 2 + s) * (a + B / s * (be + g));
        }
        case A::kBinomialTree:  // L (a + B b + B g)
          return L * (a + B * (be + g));
        default: break;
      }
      break;
    case CollectiveKind::kAlltoall:
      if (algo == A::kPairwise) return (n - 1) * (a + B / n * be);  // n-1 steps of one block
      break;
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
      // linear: n-1 blocks through the root's link, posted at once
      if (algo == A::kPairwise) return a + (n - 1) / n * B * be;
      break;
    case CollectiveKind::kBarrier:
      switch (algo) {
        case A::kRecursiveDoubling: return L * a;  // dissemination
        case A::kBinomialTree: return 2 * L * a;   // up and down the tree
        case A::kPairwise: return (n - 1) * a;     // n-1 messages injected one after another
        case A::kOneShot: return 0;                // the signature round is the barrier
        default: break;
      }
      break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: break;  // not collectives
  }
  return std::numeric_limits<double>::infinity();
}

std::vector<std::pair<Algorithm, double>> RankAlgorithms(CollectiveKind kind, size_t bytes,
                                                         int world, const LinkParams& link) {
  std::vector<std::pair<Algorithm, double>> out;
  for (Algorithm a : kAllAlgorithms) {
    if (Implements(a, kind)) out.emplace_back(a, PredictMicros(kind, a, bytes, world, link));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& x, const auto& y) { return x.second < y.second; });
  return out;
}

Algorithm ChooseAlgorithm(CollectiveKind kind, size_t bytes, int world, const LinkParams& link,
                          bool allow_oneshot) {
  auto ranked = RankAlgorithms(kind, bytes, world, link);
  if (!allow_oneshot) {
    ranked.erase(std::remove_if(ranked.begin(), ranked.end(),
                                [](const auto& x) { return x.first == Algorithm::kOneShot; }),
                 ranked.end());
  }
  if (ranked.empty()) return Algorithm::kRing;  // no such kind; RunCollective will refuse it
  const double limit = ranked.front().second * (1 + kTieFraction);
  for (Algorithm a : kAllAlgorithms) {
    for (const auto& [algo, micros] : ranked) {
      if (algo == a && micros <= limit) return a;
    }
  }
  return ranked.front().first;
}

namespace {
bool SameLink(const LinkParams& a, const LinkParams& b) {
  return a.alpha_us == b.alpha_us && a.beta_us_per_byte == b.beta_us_per_byte &&
         a.reduce_us_per_byte == b.reduce_us_per_byte &&
         a.burst_us_per_byte == b.burst_us_per_byte && a.signatures == b.signatures;
}
}  // namespace

Algorithm AlgorithmMemo::Choose(CollectiveKind kind, size_t bytes, int world,
                                const LinkParams& link, bool allow_oneshot) {
  if (!SameLink(link, link_)) {
    link_ = link;
    used_ = 0;
    next_ = 0;
  }
  for (int i = 0; i < used_; ++i) {
    const Entry& e = entries_[i];
    if (e.kind == kind && e.bytes == bytes && e.world == world &&
        e.allow_oneshot == allow_oneshot) {
      return e.algo;
    }
  }
  const Algorithm algo = ChooseAlgorithm(kind, bytes, world, link, allow_oneshot);
  Entry& slot = used_ < kEntries ? entries_[used_++] : entries_[next_++ % kEntries];
  slot = Entry{kind, bytes, world, allow_oneshot, algo};
  return algo;
}

LinkParams RefineFromObservation(const LinkParams& link, CollectiveKind kind, Algorithm algo,
                                 size_t bytes, int world, double took_us) {
  if (kind != CollectiveKind::kAllreduce || world < 2 || bytes < (1u << 20) || took_us <= 0 ||
      (algo != Algorithm::kRing && algo != Algorithm::kRecursiveHalvingDoubling)) {
    return link;
  }
  // Both move 2(n-1)/n B over the link and reduce (n-1)/n B; their latency
  // terms are small at >= 1 MiB: T = lat + 2(n-1)/n B beta + (n-1)/n B gamma.
  const double n = world, B = static_cast<double>(bytes);
  const double lat = algo == Algorithm::kRing ? 2 * (n - 1) * link.alpha_us
                                              : 2 * std::ceil(std::log2(n)) * link.alpha_us;
  const double wire = took_us - lat - (n - 1) / n * B * link.reduce_us_per_byte;
  if (wire <= 0) return link;
  const double observed_beta = wire / (2 * (n - 1) / n * B);
  LinkParams out = link;
  out.beta_us_per_byte = 0.8 * link.beta_us_per_byte + 0.2 * observed_beta;
  return out;
}

LinkParams RefineAlphaFromObservation(const LinkParams& link, CollectiveKind kind, Algorithm algo,
                                      size_t bytes, int world, double took_us) {
  if (kind != CollectiveKind::kAllreduce || world < 2 || bytes > kOneShotMaxBytes || took_us <= 0) {
    return link;
  }
  const double B = static_cast<double>(bytes);
  const double per_byte = link.beta_us_per_byte + link.reduce_us_per_byte;
  double alpha = 0;
  const double sig_rounds = SignatureRounds(link, world);
  if (algo == Algorithm::kOneShot) {
    alpha = (took_us - PredictMicros(kind, algo, bytes, world, link)) / sig_rounds;
  } else if (algo == Algorithm::kRecursiveDoubling) {
    const int lp = FloorLog2(world);
    const bool folded = (1 << lp) != world;
    double rounds = sig_rounds + lp, bytes_terms = lp * B * per_byte;
    if (folded) {
      rounds += 2;
      bytes_terms += 2 * B * link.beta_us_per_byte + B * link.reduce_us_per_byte;
    }
    alpha = (took_us - bytes_terms) / rounds;
  } else {
    return link;
  }
  if (alpha <= 0) return link;
  LinkParams out = link;
  out.alpha_us = 0.8 * link.alpha_us + 0.2 * alpha;
  return out;
}

double PredictParameterServerMicros(size_t bytes, int world, int shards, const LinkParams& link) {
  if (shards <= 0 || world <= 0) return std::numeric_limits<double>::infinity();
  const double B = static_cast<double>(bytes);
  const double per_shard = static_cast<double>(world) * B / shards;
  return 2 * link.alpha_us + std::max(B, per_shard) * link.beta_us_per_byte +
         per_shard * link.reduce_us_per_byte;
}

bool PreferParameterServer(size_t bytes, int world, int shards, const LinkParams& link) {
  if (shards <= 0 || world <= 1) return false;
  const Algorithm best = ChooseAlgorithm(CollectiveKind::kAllreduce, bytes, world, link);
  const double flat = PredictMicros(CollectiveKind::kAllreduce, best, bytes, world, link);
  return PredictParameterServerMicros(bytes, world, shards, link) < flat * (1 - kTieFraction);
}


}  // namespace gradsync
