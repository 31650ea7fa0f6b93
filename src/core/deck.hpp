#pragma once
// The input deck (DESIGN.md "Input decks", docs/deck.md): TOML in, a validated Config out.
//
// Every function here is deterministic and rank-independent: call it on every rank and every
// rank throws the same InputError at the same place (print it once, on rank 0).
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace tessera {

/// \brief Reads the TOML deck at `path`, applies `overrides`, validates every key and every
///        combination that does not depend on the world size, and returns the resolved Config.
/// \param path       the deck file; stored as given in Config::deck_path
/// \param overrides  "section.key=value" (from `--set`), applied in order after the deck; the value
///                   is parsed as a TOML value and, if that fails, taken as a bare string (a string
///                   key always takes the text after '=' as is unless it is a quoted TOML string)
/// \return the Config with deck_path and resolved_toml set; parallel.data may still be 0
/// \throws InputError, one line: "<path>:<line>: <section.key>: <what is wrong>; <what is allowed>"
///         ("--set k=v: ..." in place of "<path>:<line>" for an override)
Config load_deck(const std::string& path, const std::vector<std::string>& overrides);

/// \brief As load_deck, from TOML text (a checkpoint's `deck` attribute, the resolved deck of the
///        run that wrote it), without overrides; `name` stands for the file in messages.
Config load_deck_text(const std::string& text, const std::string& name);

/// \brief Checks what depends on the world size and resolves parallel.data = 0 to
///        world_size / (tensor * pipeline); updates cfg.resolved_toml.
///
/// data * tensor * pipeline must equal world_size and train.global_batch must split evenly over
/// data * micro_batches. This version supports data parallelism only: parallel.tensor > 1,
/// parallel.pipeline > 1 and parallel.zero > 0 are refused.
/// \throws InputError naming the keys and the numbers
void resolve_layout(Config& cfg, int world_size);

/// \brief Every key with its value as TOML text, sections in the order of DESIGN.md.
///        load_deck() of this text gives back the same Config.
std::string to_toml(const Config& cfg);

/// \brief Names of all keys, "section.key", in schema order.
std::vector<std::string> deck_keys();

/// \brief The deck name of an enum value ("sgd", "1f1b", "auto", ...), as accepted by load_deck.
std::string_view to_string(ModelKind v);
std::string_view to_string(Precision v);
std::string_view to_string(Activation v);
std::string_view to_string(GeluApproximate v);
std::string_view to_string(LossKind v);
std::string_view to_string(FieldNormalize v);
std::string_view to_string(OptimizerKind v);
std::string_view to_string(OptimizerOffload v);
std::string_view to_string(ScheduleKind v);
std::string_view to_string(PipelineSchedule v);
std::string_view to_string(ZeroGroup v);
std::string_view to_string(ContextComm v);
std::string_view to_string(AllreduceAlgorithm v);
std::string_view to_string(CommBackend v);
std::string_view to_string(ReduceDtype v);

}  // namespace tessera
