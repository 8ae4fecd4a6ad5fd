// Diffusion training of the UNet (`zeropipe train` with model.type "unet"; models/unet.h) on latent
// files (io/latent_dataset.h), under the training driver (runtime/training_driver.h), which does
// everything that is not the UNet's data, model or objective.
//
// A micro-batch: latents x0 from the latent file, a timestep and noise per sample drawn from
// (seed, step, global sample index) (runtime/diffusion_draws.h), the noisy latents and the target of
// the DDPM schedule and the weighted MSE (runtime/noise_schedule.h). The sample at global position
// p of step s comes from position s*G + m*(micro*world) + r*micro + i of the seeded epoch order,
// exactly as in the LM's training, so ZeRO stages 0-3 at any world size follow the single-rank
// trajectory, and a resumed run continues the draws. model.activation_checkpointing checkpoints the
// UNet's ResBlocks and transformer blocks (models/unet.h).
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/bootstrap.h"
#include "runtime/diffusion_config.h"
#include "runtime/train_result.h"
#include "runtime/training_place.h"
#include "runtime/training_task.h"

namespace zp::runtime {

// Trains the UNet on the ranks of `group` (default: the world). With `return_params`, every rank
// gets the final fp32 master weights (tests; small models only).
TrainResult train_unet(const UNetTrainConfig& cfg, comm::Runtime& rt, MPI_Comm group = MPI_COMM_NULL,
                       bool return_params = false);

// The UNet's task for the training driver (run_training) over `cfg` placed at `at` (both kept by
// reference, as `diffusion`): for callers that build what the trainer builds (tests comparing it
// with the planner's).
std::unique_ptr<TrainingTask> make_unet_task(const TrainConfig& cfg, const DiffusionConfig& diffusion,
                                             const TrainingPlace& at);

}  // namespace zp::runtime
