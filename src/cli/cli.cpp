#include "cli/cli.hpp"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "cli/bench_comm.hpp"
#include "cli/commands.hpp"
#include "cli/diff.hpp"
#include "cli/doctor.hpp"
#include "cli/export.hpp"
#include "cli/generate.hpp"
#include "cli/prepare_tokens.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "io/prepare_text.hpp"
#include "sci/darcy_dataset.hpp"

namespace tessera::cli {

namespace {

// How long the ranks that reached an error wait for the others before aborting the job.
constexpr double kErrorAgreementSeconds = 10.0;

// The message on one line: control characters (a deck value holding a newline, bytes of a
// damaged file) are written as escapes.
std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

// True once every rank of comm has called it, false if they have not all come within
// `seconds`: then some rank is elsewhere (in a collective this rank left by throwing).
bool all_arrive(MPI_Comm comm, double seconds) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &request);
  const double deadline = MPI_Wtime() + seconds;
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && MPI_Wtime() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done != 0;
}

// An error every rank is expected to have reached (a bad deck, file or checkpoint found by
// checks every rank makes alike, or turned into one by agree()): printed once by rank 0. If a
// rank met it alone (a check that was not agreed: a bug, but the input is still bad), the others
// never arrive: this rank prints it and ends the job with the same exit code.
int fail(MPI_Comm errors, const std::string& message, ExitCode code) {
  const std::string line = "tessera: error: " + one_line(message) + "\n";
  if (errors != MPI_COMM_NULL && !all_arrive(errors, kErrorAgreementSeconds)) {
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  }
  if (world_rank() == 0) std::fputs(line.c_str(), stderr);
  return static_cast<int>(code);
}

// --deck DECK [--set k=v ...], for subcommands whose positional argument is something else.
void add_deck_option(CLI::App* cmd, DeckArgs& a) {
  cmd->add_option("--deck", a.deck, "input deck (TOML) of the model")->required();
  cmd->add_option("--set", a.overrides, "override a deck key: section.key=value (repeatable)");
}

void add_deck(CLI::App* cmd, DeckArgs& a) {
  cmd->add_option("deck", a.deck, "input deck (TOML)")->required();
  cmd->add_option("--set", a.overrides, "override a deck key: section.key=value (repeatable)");
}

// Ends a command's help with one example command line, after its footer if it has one.
void example(CLI::App* cmd, const std::string& line) {
  const std::string footer = cmd->get_footer();
  cmd->footer((footer.empty() ? "" : footer + "\n") + "Example: " + line);
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"tessera: distributed neural-network training on MPI + Kokkos + parallel HDF5"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);

  DeckArgs deck;
  std::string resume = "none", checkpoint, out, source = "/usr/share/datasets/fashion-mnist";
  int ranks = 0, ranks_per_node = 0;

  auto* train_cmd = app.add_subcommand("train", "train the model of a deck");
  add_deck(train_cmd, deck);
  train_cmd->add_option("--resume", resume, "auto | none | PATH of a checkpoint");

  auto* check_cmd = app.add_subcommand("check", "validate a deck; print it resolved, the layout and memory");
  add_deck(check_cmd, deck);
  check_cmd->add_option("--ranks", ranks, "rank count to check the layout for (default: this run's)");
  check_cmd->add_option("--ranks-per-node", ranks_per_node,
                        "place the ranks this many per node, in blocks, to name each group's hosts (default: "
                        "the ranks running the check, or Slurm's SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE)")
      ->check(CLI::PositiveNumber);

  PlanArgs plan_args;
  auto* plan_cmd = app.add_subcommand("plan", "predict the step time of a deck's layout on N nodes from its bytes per link and a measured compute time");
  add_deck(plan_cmd, deck);
  plan_cmd->add_option("--nodes", plan_args.nodes, "nodes")->required()->check(CLI::PositiveNumber);
  plan_cmd->add_option("--gpus-per-node", plan_args.ranks_per_node, "ranks per node (one per GPU)")
      ->required()->check(CLI::PositiveNumber);
  plan_cmd->add_option("--link-gbps", plan_args.link_gbps, "each node's link, Gbit/s")->required()
      ->check(CLI::PositiveNumber);
  plan_cmd->add_option("--link-efficiency", plan_args.link_efficiency,
                       "fraction of the link rate the exchange reaches (1: nominal; the namespace cluster measured 0.4-0.5)")
      ->check(CLI::Range(0.01, 1.0))->capture_default_str();
  plan_cmd->add_option("--compute-s", plan_args.compute_s, "compute seconds per step at the deck's per-rank batch");
  plan_cmd->add_option("--from", plan_args.from, "a run directory of this deck whose metrics.csv gives the compute time per step");

  auto* eval_cmd = app.add_subcommand("eval", "evaluate a checkpoint on the deck's test split");
  add_deck(eval_cmd, deck);
  eval_cmd->add_option("--checkpoint", checkpoint, "checkpoint file")->required();

  GenerateArgs gen;
  auto* generate_cmd = app.add_subcommand("generate", "sample text from a trained gpt checkpoint");
  add_deck(generate_cmd, gen.deck);
  generate_cmd->add_option("--checkpoint", gen.checkpoint, "checkpoint file")->required();
  generate_cmd->add_option("--prompt", gen.prompt, "text to continue")->required();
  generate_cmd->add_option("--tokens", gen.tokens, "tokens (bytes) to generate")->capture_default_str();
  generate_cmd->add_option("--temperature", gen.temperature, "softmax temperature; 0: greedy")->capture_default_str();
  generate_cmd->add_option("--top-k", gen.top_k, "sample among the k most likely tokens; 0: all")->capture_default_str();
  generate_cmd->add_option("--seed", gen.seed, "seed of the sampling (same seed, same text)")->capture_default_str();

  auto* prepare_cmd = app.add_subcommand("prepare", "convert a dataset to Tessera's HDF5 layout");
  prepare_cmd->require_subcommand(1);
  auto* fmnist_cmd = prepare_cmd->add_subcommand("fashion-mnist", "Fashion-MNIST IDX files to HDF5");
  fmnist_cmd->add_option("--out", out, "output HDF5 file")->required();
  fmnist_cmd->add_option("--source", source, "folder of the IDX files")->capture_default_str();
  std::vector<std::string> text_inputs;
  double val_fraction = io::kDefaultValFraction;
  auto* text_cmd = prepare_cmd->add_subcommand("text", "text files as tokens: /train, and the held-out tail as /val");
  text_cmd->footer(
      "The inputs are concatenated in the order given; without --tokenizer each byte is one token "
      "(vocab_size 256, tokenizer \"bytes\"), stored as uint8 in /train/tokens and /val/tokens. /val is "
      "the last round(F x tokens) of the text (at least 1 token, and 1 is left for /train). With "
      "--tokenizer, the ids of a byte-level BPE (Hugging Face's encode without special tokens, each file "
      "one document), uint16 up to 65536 ids, else int32, the tokenizer stored in the file "
      "(docs/data.md \"Tokenizers\").");
  text_cmd->add_option("--out", out, "output HDF5 file")->required();
  text_cmd->add_option("--val-fraction", val_fraction, "share of the text, from its end, held out as /val; in (0, 1)")
      ->capture_default_str();
  text_cmd->add_option("inputs", text_inputs, "text files, concatenated in this order")->required();
  PrepareTokensArgs tokens_args;
  text_cmd->add_option("--tokenizer", tokens_args.tokenizer,
                       "a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2), or GPT-2's vocab.json "
                       "with --merges; each file is then encoded as one document, on every rank a share");
  text_cmd->add_option("--merges", tokens_args.merges, "GPT-2's merges.txt, with --tokenizer vocab.json");
  text_cmd->add_option("--invalid-utf8", tokens_args.invalid_utf8,
                       "with --tokenizer, text that is not UTF-8: error (exit 2), or replace (each bad sequence "
                       "read as U+FFFD, as Python's decode(errors=\"replace\"))")
      ->capture_default_str();

  sci::DarcyOptions darcy;
  auto* darcy_cmd = prepare_cmd->add_subcommand(
      "darcy", "Darcy flow fields (-div(a grad u) = 1, a random two-phase permeability) solved by Tessera: /train, /test");
  darcy_cmd->footer("Under mpirun the ranks split every sample's rows (as parallel.spatial does): each solves and "
                    "writes its block. Layout and solver: docs/data.md.");
  darcy_cmd->add_option("--out", darcy.out, "output HDF5 file")->required();
  darcy_cmd->add_option("--size", darcy.size, "interior grid nodes per side (H = W)")->capture_default_str();
  darcy_cmd->add_option("--train", darcy.train, "training samples")->capture_default_str();
  darcy_cmd->add_option("--test", darcy.test, "test samples")->capture_default_str();
  darcy_cmd->add_option("--seed", darcy.seed, "seed of the permeability fields")->capture_default_str();
  darcy_cmd->add_option("--tolerance", darcy.tolerance, "conjugate gradients' relative residual")->capture_default_str();

  auto* inspect_cmd = app.add_subcommand("inspect", "print a checkpoint's attributes and tensors");
  inspect_cmd->add_option("checkpoint", checkpoint, "checkpoint file")->required();

  DiffArgs diff_args;
  auto* diff_cmd = app.add_subcommand("diff", "compare two checkpoints tensor by tensor, whatever layouts wrote them");
  diff_cmd->footer(
      "Per tensor: max_abs = max|a-b|, max_rel = max_abs / max(max|a|, max|b|).\n"
      "Exit codes: 0 compared (whatever the differences when no --tolerance is given); 1 with "
      "--tolerance, when a tensor's max_rel exceeds it, a tensor is in one file only or its shapes "
      "differ; 2 bad input (a file missing or not a checkpoint).");
  diff_cmd->add_option("a", diff_args.a, "checkpoint A")->required();
  diff_cmd->add_option("b", diff_args.b, "checkpoint B")->required();
  diff_cmd->add_option("--tolerance", diff_args.tolerance,
                       "largest max_rel allowed; exit 1 beyond it or when the tensor sets or shapes differ");
  diff_cmd->add_option("--csv", diff_args.csv, "also write name,shape,max_abs,max_rel,status rows to this CSV file");
  diff_cmd->add_flag("--model-only", diff_args.model_only, "compare /model only, not the optimizer state");

  std::string run_dir;
  auto* doctor_cmd = app.add_subcommand("doctor", "read the ranks' flight records after a hang or crash");
  doctor_cmd->add_option("run_dir", run_dir, "the run's run.output_dir (flight records in RUN_DIR/flight)")->required();
  doctor_cmd->footer("Exit codes: 0 the records were read and judged; 2 RUN_DIR holds no flight records, or one "
                     "cannot be read.");

  ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model for PyTorch or Hugging Face");
  export_cmd->footer(
      "Writes the model as safetensors (F32) or a torch.save state_dict (torch.load(..., weights_only=True)) "
      "with PyTorch's parameter names and layouts, and a JSON of the model's configuration beside it "
      "(docs/models.md \"Export and import\").");
  export_cmd->add_option("checkpoint", export_args.checkpoint, "checkpoint file")->required();
  export_cmd->add_option("--format", export_args.format, "safetensors | torch")
      ->check(CLI::IsMember({"safetensors", "torch"}))->capture_default_str();
  export_cmd->add_option("--out", export_args.out,
                         "file to write (default: the checkpoint's path with .safetensors or .pt); the JSON goes "
                         "beside it as .json; with --hf-gpt2 or --hf-llama a directory (default: the checkpoint's "
                         "path + -hf)");
  auto* hf_gpt2 = export_cmd->add_flag("--hf-gpt2", export_args.hf_gpt2,
                                       "a gpt as Hugging Face's GPT2LMHeadModel: a directory with model.safetensors "
                                       "(or pytorch_model.bin) and config.json");
  export_cmd->add_flag("--hf-llama", export_args.hf_llama,
                       "a llama as Hugging Face's LlamaForCausalLM: a directory with model.safetensors (or "
                       "pytorch_model.bin) and config.json")
      ->excludes(hf_gpt2);
  export_cmd->add_flag("--optimizer", export_args.optimizer,
                       "also the optimizer state (optimizer/<name>/<state>) and where training stood");

  ImportArgs import_args;
  auto* import_cmd = app.add_subcommand("import", "a safetensors file as a checkpoint of a deck's model");
  import_cmd->footer(
      "The file must hold the deck's model with the names and shapes `tessera export` writes (Tessera's, or "
      "Hugging Face's: GPT-2 names for a gpt, Llama names for a llama); F32, F16, BF16 and F64 convert. A "
      "sharded Hugging Face checkpoint is read through its model.safetensors.index.json. Without optimizer "
      "state the checkpoint is at step 0 with zero state: `tessera train DECK --resume CHECKPOINT` fine-tunes it.");
  import_cmd->add_option("file", import_args.file,
                         "safetensors file, a model.safetensors.index.json (sharded), or a directory with either")
      ->required();
  add_deck_option(import_cmd, import_args.deck);
  import_cmd->add_option("--out", import_args.out, "checkpoint to write (must not exist)")->required();

  auto* bench_cmd = app.add_subcommand("bench", "measure one part of the stack");
  bench_cmd->require_subcommand(1);
  BenchCommArgs bench_comm_args;
  auto* bench_comm_cmd = bench_cmd->add_subcommand("comm", "time the allreduce algorithms and backends over message sizes");
  bench_comm_cmd->add_option("--sizes", bench_comm_args.sizes, "LO..HI bytes (K, M, G), powers of 4 between")->capture_default_str();
  bench_comm_cmd->add_option("--algorithms", bench_comm_args.algorithms, "comma-separated: mpi, ring, parameter-server, hierarchical")->capture_default_str();
  bench_comm_cmd->add_option("--reduce-dtypes", bench_comm_args.reduce_dtypes, "comma-separated wire types of the sum, as comm.reduce_dtype: fp32, bf16")->capture_default_str();
  bench_comm_cmd->add_option("--backends", bench_comm_args.backends, "all, or comma-separated: mpi, staged, cuda-aware-mpi, nccl (device rows need a CUDA device)")->capture_default_str();
  bench_comm_cmd->add_option("--iters", bench_comm_args.iters, "timed iterations per size (fewer above 16M)")->capture_default_str();
  bench_comm_cmd->add_option("--warmup", bench_comm_args.warmup, "untimed iterations per size")->capture_default_str();
  bench_comm_cmd->add_option("--segment-kb", bench_comm_args.segment_kb, "ring and parameter-server message size, as comm.ring_segment_kb")->capture_default_str();
  bench_comm_cmd->add_option("--csv", bench_comm_args.csv, "write the results to this CSV file");

  app.footer("Kokkos's own arguments (--kokkos-*) go to Kokkos alone: tessera --kokkos-help lists them.");
  // One example command line at the end of every command's help.
  example(&app, "tools/mpirun.sh -n 2 tessera train inputs/fashion_mnist_mlp.toml --resume auto");
  example(train_cmd, "tools/mpirun.sh -n 4 tessera train inputs/fashion_mnist_mlp.toml --set train.epochs=3 --resume auto");
  example(check_cmd, "tessera check inputs/fashion_mnist_mlp.toml --ranks 4 --ranks-per-node 2");
  example(plan_cmd, "tessera plan inputs/kjv_gpt.toml --nodes 64 --gpus-per-node 4 --link-gbps 200 --from runs/kjv_gpt");
  example(eval_cmd, "tools/mpirun.sh -n 2 tessera eval inputs/fashion_mnist_mlp.toml --checkpoint runs/fashion_mnist_mlp/checkpoints/step_00004680.h5");
  example(generate_cmd, "tessera generate inputs/kjv_gpt.toml --checkpoint runs/kjv_gpt/checkpoints/step_00003500.h5 --prompt \"And God said\" --tokens 200 --temperature 0.8 --top-k 40");
  example(prepare_cmd, "tessera prepare fashion-mnist --out data/fashion-mnist.h5");
  example(fmnist_cmd, "tessera prepare fashion-mnist --out data/fashion-mnist.h5 --source /usr/share/datasets/fashion-mnist");
  example(text_cmd, "tools/mpirun.sh -n 4 tessera prepare text --tokenizer tokenizer.json --out data/kjv_bpe.h5 data/kjv.txt");
  example(darcy_cmd, "tools/mpirun.sh -n 2 tessera prepare darcy --out data/darcy.h5 --size 64 --train 1000 --test 100");
  example(inspect_cmd, "tessera inspect runs/fashion_mnist_mlp/checkpoints/step_00004680.h5");
  example(diff_cmd, "tessera diff runs/a/checkpoints/step_00000100.h5 runs/b/checkpoints/step_00000100.h5 --tolerance 1e-5");
  example(doctor_cmd, "tessera doctor runs/fashion_mnist_mlp");
  example(export_cmd, "tessera export runs/kjv_gpt/checkpoints/step_00003500.h5 --hf-gpt2 --out kjv-gpt2-hf");
  example(import_cmd, "tessera import model.safetensors --deck inputs/kjv_gpt.toml --out imported.h5");
  example(bench_cmd, "tools/mpirun.sh -n 2 tessera bench comm --sizes 1K..64M");
  example(bench_comm_cmd, "tools/mpirun.sh -n 2 tessera bench comm --sizes 1K..64M --algorithms mpi,ring --csv comm.csv");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return world_rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    return fail(MPI_COMM_NULL, e.what() + std::string(" (see tessera --help)"), ExitCode::bad_input);
  }

  // Its own communicator for the errors' closing agreement, so that it never meets a collective
  // another rank is still inside.
  MPI_Comm errors = MPI_COMM_NULL;
  if (world_size() > 1) MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &errors));

  try {
    if (*train_cmd) return train(deck, resume);
    if (*check_cmd) return check(deck, ranks, ranks_per_node);
    if (*plan_cmd) return plan(deck, plan_args);
    if (*eval_cmd) return eval(deck, checkpoint);
    if (*generate_cmd) return generate(gen);
    if (*fmnist_cmd) return prepare_fashion_mnist(out, source);
    if (*text_cmd) {
      if (tokens_args.tokenizer.empty()) {
        if (!tokens_args.merges.empty() || text_cmd->count("--invalid-utf8"))
          throw InputError("prepare text: --merges and --invalid-utf8 go with --tokenizer");
        return prepare_text(text_inputs, out, val_fraction);
      }
      tokens_args.inputs = text_inputs;
      tokens_args.out = out;
      tokens_args.val_fraction = val_fraction;
      return prepare_tokens(tokens_args);
    }
    if (*darcy_cmd) return prepare_darcy(darcy);
    if (*inspect_cmd) return inspect(checkpoint);
    if (*diff_cmd) return diff(diff_args);
    if (*doctor_cmd) return doctor(run_dir);
    if (*export_cmd) return export_checkpoint(export_args);
    if (*import_cmd) return import_checkpoint(import_args);
    if (*bench_comm_cmd) return bench_comm(bench_comm_args);
  } catch (const InputError& e) {
    return fail(errors, e.what(), ExitCode::bad_input);
  } catch (const NumericError& e) {
    return fail(errors, e.what(), ExitCode::numerical);
  } catch (const std::exception& e) {
    // A local failure: the other ranks may be inside a collective, so end the whole job.
    std::fprintf(stderr, "tessera: rank %d: internal error: %s\n", world_rank(), one_line(e.what()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(ExitCode::failure));
  }
  return 0;
}

}  // namespace tessera::cli
