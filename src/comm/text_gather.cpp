#include "comm/text_gather.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace zp::comm {

std::vector<std::string> gather_text(const std::string& mine, int root, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return {mine};
  int rank = 0, size = 1;
  ZP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ZP_MPI_CHECK(MPI_Comm_size(comm, &size));
  ZP_REQUIRE(mine.size() < size_t(1) << 31, "gather_text: ", mine.size(), " bytes from one rank (at most 2 GiB)");
  int len = int(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), displs(static_cast<size_t>(size), 0);
  // Every rank learns every length, so a total too large for MPI's int counts fails on all of them.
  ZP_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    displs[size_t(r)] = int(std::min<int64_t>(total, INT32_MAX));
    total += lens[size_t(r)];
  }
  ZP_REQUIRE(total < int64_t(1) << 31, "gather_text: ", total, " bytes in all (at most 2 GiB)");
  std::string all(rank == root ? size_t(total) : 0, '\0');
  ZP_MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root, comm));
  std::vector<std::string> out;
  if (rank == root)
    for (int r = 0; r < size; ++r) out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lens[size_t(r)])));
  return out;
}

}  // namespace zp::comm
