// ProgressMeter: quiet for a fast operation, one line per interval with percent, amount and ETA
// for a slow one, on a fake clock.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/progress_meter.h"

namespace zp::test {

TEST(ProgressMeter, PrintsPercentAmountAndEtaAtMostEveryInterval) {
  double now = 100;
  std::vector<std::string> lines;
  ProgressMeter m("saving step-10.h5", 6.9e9, "GB", 10, [&] { return now; },
                  [&](const std::string& l) { lines.push_back(l); });
  now = 105;
  m.update(1e9);
  EXPECT_TRUE(lines.empty()) << "nothing in the first 10 s";
  now = 110;
  m.update(3.1e9);  // 3.1 GB in 10 s: 3.8 GB left at 0.31 GB/s is 12 s
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "saving step-10.h5: 45% (3.1 of 6.9 GB), ETA 12 s");
  now = 115;
  m.update(4e9);
  EXPECT_EQ(lines.size(), 1u) << "at most one line per 10 s";
  now = 120.5;
  m.update(6e9);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "saving step-10.h5: 87% (6.0 of 6.9 GB), ETA 3 s");
  now = 200;
  m.update(6.9e9);
  EXPECT_EQ(m.lines_printed(), 2) << "the finished operation prints no progress line";
}

TEST(ProgressMeter, FastOperationPrintsNothing) {
  double now = 0;
  int lines = 0;
  ProgressMeter m("loading", 100, "tensors", 10, [&] { return now; }, [&](const std::string&) { ++lines; });
  for (int i = 0; i < 100; ++i) {
    now += 0.05;
    m.update(i);
  }
  EXPECT_EQ(lines, 0);
}

TEST(ProgressMeter, CountsAndLongEtas) {
  ProgressMeter m("make-latents", 1000, "images", 10, [] { return 0.0; }, [](const std::string&) {});
  EXPECT_EQ(m.line(10, 72), "make-latents: 1% (10 of 1000 images), ETA 2.0 h");
  EXPECT_EQ(m.line(0, 60), "make-latents: 0% (0 of 1000 images), ETA unknown");
  EXPECT_EQ(human_duration(150), "2.5 min");
}

}  // namespace zp::test
