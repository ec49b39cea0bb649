// The alpha-beta-gamma cost model and the algorithm choice (pure, no I/O).
//
// Like NCCL's tuning.cc, the choice of algorithm lives here and only here:
// callers ask ChooseAlgorithm and log RankAlgorithms to explain it.
//
// Model (Hockney; Thakur, Rabenseifner & Gropp 2005): sending a message of m
// bytes costs alpha + m*beta; reducing m bytes locally costs m*gamma. A rank
// sends and receives at the same time (full duplex) and talks to one peer per
// step. `bytes` is the op's buffer on one rank (CollectiveBufferBytes in
// collectives.h): count*elem for allreduce/broadcast/reduce, n*count*elem for
// reduce_scatter/allgather/alltoall, 0 for barrier. The formulas, with
// n = world, L = ceil(log2 n), p = the largest power of two <= n,
// l = log2 p, B = bytes, are in cost_model.cc.
#ifndef GRADSYNC_COLLECTIVE_COST_MODEL_H_
#define GRADSYNC_COLLECTIVE_COST_MODEL_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "collective/algorithm.h"
#include "common/types.h"

namespace gradsync {

struct LinkParams {
  double alpha_us = 50.0;            // latency per message
  double beta_us_per_byte = 1e-4;    // inverse bandwidth (1e-4 = 10 GB/s)
  double reduce_us_per_byte = 1e-4;  // local reduction cost (gamma)
  // Inverse bandwidth of oneshot's pattern: every rank sending a small
  // message to every other rank at once (measured by the link probe with
  // 16 KiB messages); 0 = unknown, use beta.
  double burst_us_per_byte = 0;
  // How every op's signatures travel (algorithm.h), which sets what oneshot
  // costs. Agreed by every rank of a job at the probe, never refined.
  SignaturePattern signatures = SignaturePattern::kAllToAll;
};

// Predicted microseconds of `kind` with `algo` on `world` ranks, for a buffer
// of `bytes` per rank. +infinity when `algo` does not implement `kind`
// (algorithm.h). 0 for a world of one.
double PredictMicros(CollectiveKind kind, Algorithm algo, size_t bytes, int world,
                     const LinkParams& link);

// Every algorithm that implements `kind` with its prediction, cheapest first
// (ties in kAllAlgorithms order).
std::vector<std::pair<Algorithm, double>> RankAlgorithms(CollectiveKind kind, size_t bytes,
                                                         int world, const LinkParams& link);

// Predictions closer than this fraction of the cheapest count as a tie: the
// model cannot tell them apart, so the choice goes by kAllAlgorithms order
// (ring first: fixed neighbours, fully pipelined, the most exercised path).
inline constexpr double kTieFraction = 0.02;

// The algorithm to run: among the implementing algorithms predicted within
// kTieFraction of the cheapest, the first in kAllAlgorithms order. Always one
// that implements `kind`. Predictions leave out the signature round that
// every op starts with (collective/op_signature.h): oneshot's data rides on
// it, so oneshot has no latency term of its own.
//
// `allow_oneshot` = false leaves oneshot out. The daemon decides whether an
// op runs oneshot before the signature round, from inputs equal on every rank
// (the signature and the link measured when the job formed); ops that do not
// take it then choose among the others with this rank's refined link.
Algorithm ChooseAlgorithm(CollectiveKind kind, size_t bytes, int world, const LinkParams& link,
                          bool allow_oneshot = true);

// ChooseAlgorithm, remembered: a job's ops come in a few shapes (its
// gradient buckets) and the answer changes only with the link estimate, so
// a planner asks the model once per shape instead of once per op (ranking
// every algorithm costs more than a small op's own bookkeeping). Holds up to
// kEntries answers for one LinkParams; a different link (a refined
// estimate) forgets them. Not thread-safe.
class AlgorithmMemo {
 public:
  static constexpr int kEntries = 16;

  Algorithm Choose(CollectiveKind kind, size_t bytes, int world, const LinkParams& link,
                   bool allow_oneshot = true);

 private:
  struct Entry {
    CollectiveKind kind;
    size_t bytes;
    int world;
    bool allow_oneshot;
    Algorithm algo;
  };
  LinkParams link_;
  Entry entries_[kEntries];
  int used_ = 0;
  int next_ = 0;  // the entry to replace when full
};

// Parameter-server allreduce (gradsync-ps) with `shards` shards on links like
// the workers': every worker pushes B bytes and pulls B bytes at once (full
// duplex), every shard takes in world*B/shards bytes and reduces them:
//   2a + max(B, world*B/shards) b + world*B/shards g
// versus ring's 2(n-1)a + 2(n-1)/n B b + (n-1)/n B g: with enough shards PS
// moves half the bytes per worker.
// Refreshes the latency estimate from a latency-bound op: a oneshot allreduce
// (its data ride on the signature exchange: took = s a + its bytes terms, s
// the exchange's rounds: 1 all-to-all, log2 p (+2 folded) by recursive
// doubling, see SignaturePatternFor) or an rd allreduce of at most
// kOneShotMaxBytes (the exchange plus its own steps: took = s a + l (a + B
// (b + g)), folding adds 2a + 2B b + B g) implies an alpha; the estimate
// moves 20% of the way towards it. An op's time includes waiting for the
// slowest rank, so callers pass the fastest of several (stragglers only
// add). Other ops return `link` unchanged.
LinkParams RefineAlphaFromObservation(const LinkParams& link, CollectiveKind kind, Algorithm algo,
                                      size_t bytes, int world, double took_us);

double PredictParameterServerMicros(size_t bytes, int world, int shards, const LinkParams& link);
// Whether PS beats the best flat algorithm for this allreduce.
bool PreferParameterServer(size_t bytes, int world, int shards, const LinkParams& link);

// Refreshes the link estimate from a transfer this rank saw: a bandwidth-
// bound op (ring or rhd allreduce of at least 1 MiB) that took `took` implies
// an inverse bandwidth beta; the estimate moves 20% of the way towards it
// (an EWMA, so one noisy op does not flip the choice). Other ops return `link`
// unchanged. Ranks may drift apart: the daemon runs rank 0's choice.
LinkParams RefineFromObservation(const LinkParams& link, CollectiveKind kind, Algorithm algo,
                                 size_t bytes, int world, double took_us);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_COST_MODEL_H_
