// rackhubctl's option groups shared by several commands: the optimizer
// options (tenant create's default optimizer, key create, key set-optimizer)
// and the quota options (tenant create, tenant set-quotas), declared in
// command_tree.h.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "command_tree.h"
#include "format.h"
#include "help.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

constexpr const char* kOptimizerGroup = "Optimizer options";
constexpr const char* kQuotaGroup = "Quota options";

}  // namespace

const std::vector<std::string> kOptimizerOptions = {
    "--optimizer", "--lr",      "--momentum",            "--weight-decay", "--beta1",
    "--beta2",     "--epsilon", "--initial-accumulator", "--reduction"};
const std::vector<std::string> kQuotaOptions = {"--max-param-bytes", "--max-keys",
                                                "--max-workers"};

bool AnyGiven(const CLI::App& command, const std::vector<std::string>& options) {
  return std::any_of(options.begin(), options.end(),
                     [&command](const std::string& o) { return Given(command, o); });
}

// `create`: the optimizer is given in full, so hyperparameters without a type
// (which would be ambiguous) are refused while parsing.
void AddOptimizerOptions(CLI::App* command, OptimizerArgs* a, bool create) {
  AddChoiceOption(command, "--optimizer", &a->type, JoinChoices(Names(kOptimizerTypeNames)),
                  kOptimizerTypeNames, "TYPE")
      ->group(kOptimizerGroup);
  const auto decimal = [&](const char* name, double* value, const char* what) {
    command->add_option(name, *value, what)
        ->type_name("X")
        ->check(DecimalValidator())
        ->group(kOptimizerGroup);
  };
  decimal("--lr", &a->lr, "learning rate (> 0; unused by sum-only)");
  decimal("--momentum", &a->momentum, "momentum, nesterov: in (0, 1)");
  decimal("--weight-decay", &a->weight_decay, ">= 0 (adamw: decoupled)");
  decimal("--beta1", &a->beta1, "adam, adamw: in [0, 1) (default 0.9)");
  decimal("--beta2", &a->beta2, "adam, adamw: in [0, 1) (default 0.999)");
  decimal("--epsilon", &a->epsilon, "adam, adamw, adagrad (default 1e-8; adagrad 1e-10)");
  decimal("--initial-accumulator", &a->initial_accumulator, "adagrad: >= 0");
  AddChoiceOption(command, "--reduction", &a->reduction,
                  "how the workers' gradients are combined (default mean)", kReductionNames)
      ->group(kOptimizerGroup);
  if (create) {
    command->callback([command] {
      if (Given(*command, "--optimizer")) return;
      for (const auto& name : kOptimizerOptions) {
        if (Given(*command, name)) {
          throw CLI::ValidationError(name, "needs --optimizer TYPE (on create the optimizer is "
                                           "given in full)");
        }
      }
    });
  }
}

// Overlays the optimizer options given to `command` on `base`.
admin::Optimizer ApplyOptimizerOptions(const CLI::App& command, const OptimizerArgs& a,
                                       admin::Optimizer base) {
  if (Given(command, "--optimizer")) base.set_type(*Choice(a.type, kOptimizerTypeNames));
  if (Given(command, "--lr")) base.set_learning_rate(a.lr);
  if (Given(command, "--momentum")) base.set_momentum(a.momentum);
  if (Given(command, "--weight-decay")) base.set_weight_decay(a.weight_decay);
  if (Given(command, "--beta1")) base.set_beta1(a.beta1);
  if (Given(command, "--beta2")) base.set_beta2(a.beta2);
  if (Given(command, "--epsilon")) base.set_epsilon(a.epsilon);
  if (Given(command, "--initial-accumulator")) base.set_initial_accumulator(a.initial_accumulator);
  if (Given(command, "--reduction")) base.set_reduction(*Choice(a.reduction, kReductionNames));
  return base;
}

void AddQuotaOptions(CLI::App* command, QuotaArgs* q) {
  command->add_option("--max-param-bytes", q->max_param_bytes,
                      "hub memory all keys may hold: fp32 parameters x2, optimizer state,\n"
                      "accumulators, parked contributions (Adam, 2 workers: ~6x the parameters)")
      ->type_name("SIZE")
      ->transform(SizeValidator())
      ->group(kQuotaGroup);
  command->add_option("--max-keys", q->max_keys, "number of keys")
      ->type_name("N")
      ->check(U32Validator())
      ->group(kQuotaGroup);
  command->add_option("--max-workers", q->max_workers, "workers per rack")
      ->type_name("N")
      ->check(U32Validator())
      ->group(kQuotaGroup);
  command->add_option("--weight", q->weight,
                      "share of each lane against other busy tenants (fair scheduler) [1]")
      ->type_name("N")
      ->check(CLI::Range(1, 1000))
      ->group(kQuotaGroup);
}

admin::Quotas ToQuotas(const CLI::App& command, const QuotaArgs& q) {
  admin::Quotas out;
  if (Given(command, "--max-param-bytes")) out.set_max_parameter_bytes(q.max_param_bytes);
  if (Given(command, "--max-keys")) out.set_max_keys(q.max_keys);
  if (Given(command, "--max-workers")) out.set_max_workers(q.max_workers);
  if (Given(command, "--weight")) out.set_weight(q.weight);
  return out;
}

}  // namespace rackhub::cli
