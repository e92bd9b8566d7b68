// SPDX-License-Identifier: Apache-2.0
#include "store/reclaimer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <thread>

#include "core/mutex.h"

namespace kvtier {
namespace {

using Marks = Reclaimer::Marks;

// Passes seen, and the marks of the last.
struct Seen {
  Mutex mu;
  std::condition_variable_any cv;
  int passes ABSL_GUARDED_BY(mu) = 0;
  Marks last ABSL_GUARDED_BY(mu);

  Reclaimer::Pass Pass() {
    return [this](Marks m) {
      {
        MutexLock l(&mu);
        ++passes;
        last = m;
      }
      cv.notify_all();
    };
  }
  // Waits (up to 10 s) for a pass after the first `after`; its marks.
  std::optional<Marks> Next(int after) {
    MutexLock l(&mu);
    if (!mu.AwaitFor(cv, std::chrono::seconds(10), [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return passes > after; })) {
      return std::nullopt;
    }
    return last;
  }
  int count() {
    MutexLock l(&mu);
    return passes;
  }
};

TEST(ReclaimerTest, MarksOutsideTheirRangeAreRefusedAndKeepTheOldOnes) {
  Seen seen;
  Reclaimer r({0.9, 0.8}, seen.Pass());
  EXPECT_TRUE(absl::IsInvalidArgument(r.SetMarks({0.5, 0.6})));   // low above high
  EXPECT_TRUE(absl::IsInvalidArgument(r.SetMarks({0.5, 0.01})));  // low under 0.05
  EXPECT_TRUE(absl::IsInvalidArgument(r.SetMarks({1.5, 0.8})));   // high above 1
  EXPECT_EQ(r.marks().high, 0.9);
  EXPECT_EQ(r.marks().low, 0.8);
  EXPECT_FALSE(r.running());  // SetMarks refused: nothing started
}

TEST(ReclaimerTest, OffAtOneAndStartedByAReloadThatLowersTheMark) {
  Seen seen;
  Reclaimer r({1.0, 1.0}, seen.Pass());
  r.Start();
  EXPECT_FALSE(r.running());  // a high mark of 1 is off
  ASSERT_TRUE(r.SetMarks({0.75, 0.6}).ok());
  EXPECT_TRUE(r.running());
  std::optional<Marks> m = seen.Next(0);
  ASSERT_TRUE(m.has_value()) << "no pass after the reload";
  EXPECT_EQ(m->high, 0.75);
  EXPECT_EQ(m->low, 0.6);
  // A wake runs another pass, well before the 100 ms backstop would matter
  // for correctness; the marks it sees are the current ones.
  ASSERT_TRUE(r.SetMarks({0.5, 0.3}).ok());
  bool saw_new = false;
  for (int i = 0; i < 50 && !saw_new; ++i) {
    const int before = seen.count();
    r.Wake();
    m = seen.Next(before);
    ASSERT_TRUE(m.has_value());
    saw_new = m->high == 0.5 && m->low == 0.3;
  }
  EXPECT_TRUE(saw_new);
  r.Stop();
  EXPECT_FALSE(r.running());
  const int after_stop = seen.count();
  r.Wake();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(seen.count(), after_stop);  // stopped: no pass, woken or not
}

TEST(ReclaimerTest, MarksMadeOfSixDecimalsComeBackExactly) {
  Seen seen;
  // 0.062507 and 0.999999 are not whole millionths in binary: truncating
  // instead of rounding would give them back one millionth low.
  // Each pair: a high mark and a low one a millionth under it.
  const std::pair<double, double> pairs[] = {{1.0, 0.999999},      {0.95, 0.949999},     {0.123456, 0.123455},
                                             {0.062507, 0.062506}, {0.999999, 0.999998}, {0.05, 0.05}};
  for (const auto& [high, low] : pairs) {
    Reclaimer r({high, low}, seen.Pass());
    EXPECT_EQ(r.marks().high, high);
    EXPECT_EQ(r.marks().low, low);
  }
  // A high mark under 1 keeps the reclaimer on, however close to 1.
  Reclaimer almost({0.9999999, 0.5}, seen.Pass());
  EXPECT_LT(almost.marks().high, 1.0);
  almost.Start();
  EXPECT_TRUE(almost.running());
  almost.Stop();
  // Not a number is off.
  Reclaimer nan({std::nan(""), std::nan("")}, seen.Pass());
  EXPECT_EQ(nan.marks().high, 1.0);
  EXPECT_EQ(nan.marks().low, 1.0);
}

// Stress, as a guard: a reader never sees a reload's halves mixed. (With two
// separate atomics the mix is rare: a loop of the old stores tore in about
// one run of six, so this test alone would seldom catch it; the marks being
// one lock-free word is what makes it hold, asserted in reclaimer.h.)
TEST(ReclaimerTest, ReadersNeverSeeHalfAReload) {
  Seen seen;
  Reclaimer r({0.3, 0.2}, seen.Pass());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, reads{0};
  std::thread reader([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const Marks m = r.marks();
      if (m.low > m.high) torn.fetch_add(1);
      reads.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (reads.load() == 0) std::this_thread::yield();  // the reader runs
  // 20k reloads, and on until the reader has looked 20k times (on a busy
  // machine it may get few turns).
  for (int i = 0; i < 20000 || reads.load(std::memory_order_relaxed) < 20000; ++i) {
    const absl::Status s = i % 2 ? r.SetMarks({0.3, 0.2}) : r.SetMarks({0.9, 0.85});
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;  // the reader is joined below either way
  }
  stop = true;
  reader.join();
  r.Stop();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GE(reads.load(), 20000u);
}

}  // namespace
}  // namespace kvtier
