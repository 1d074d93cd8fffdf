// rackhubctl tenant create|get|list|set-quotas|delete (the admin
// TenantService), registered by Commands (commands.cc).
#include <string>
#include <variant>

#include "command_tree.h"
#include "format.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

using TenantStub = admin::TenantService::Stub;

// A request that names the tenant `name`.
template <typename Request>
Request Named(const std::string& name) {
  Request request;
  request.set_name(name);
  return request;
}

// --consistency sync|bounded:S|async.
Status SetConsistency(const std::string& text, admin::CreateTenantRequest* r) {
  if (text == "sync") {
    r->set_consistency(admin::SYNC);
    return Status::Ok();
  }
  if (text == "async") {
    r->set_consistency(admin::ASYNC);
    return Status::Ok();
  }
  const std::string num = text.rfind("bounded:", 0) == 0 ? text.substr(8) : std::string();
  const bool digits = !num.empty() && num.size() <= 7 &&
                      num.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    return InvalidArgument("--consistency: '" + text +
                           "' is not sync, async or bounded:S (S a whole number of iterations)");
  }
  r->set_consistency(admin::BOUNDED);
  r->set_staleness(static_cast<uint32_t>(std::stoul(num)));
  return Status::Ok();
}

}  // namespace

void AddTenantCommands(CLI::App* tenant, Handlers* handlers) {
  {
    struct Args {
      std::string name, token_file, consistency;
      uint32_t workers = 0, chunk_bytes = 0, min_workers = 0;
      bool elastic = false;
      OptimizerArgs optimizer;
      QuotaArgs quotas;
    };
    const auto c = DefineCommand<Args>(
        tenant, "create", "create a tenant; prints its data-plane token (shown only this once)",
        "Creates a tenant with N workers per rack and prints the tenant and its data-plane\n"
        "token: the token is shown only this once. Without optimizer options the default\n"
        "optimizer is sgd --lr 0.01; quotas left out (or 0) use the daemon's defaults.");
    Args& a = *c.args;
    AddArgument(c.app, "NAME", &a.name, "tenant name (1-63 of a-z 0-9 _ -)");
    c.app->add_option("--workers", a.workers, "workers per rack")
        ->type_name("N")
        ->check(U32Validator())
        ->required();
    c.app
        ->add_option("--chunk-bytes", a.chunk_bytes,
                     "chunk size, a multiple of 64 in [1KiB, 64MiB] (default 32KiB)")
        ->type_name("SIZE")
        ->transform(Size32Validator());
    c.app
        ->add_option("--tenant-token-file", a.token_file,
                     "use the token in FILE (32-128 of A-Z a-z 0-9 _ -) instead of minting one:\n"
                     "the same tenant on every rack's hub shares one token")
        ->type_name("FILE");
    c.app
        ->add_option("--consistency", a.consistency,
                     "how workers wait for each other (default sync; docs/consistency.md)")
        ->type_name("sync|bounded:S|async");
    c.app->add_flag("--elastic", a.elastic,
                    "ranks join and leave while the job runs (docs/elastic.md): --workers is the\n"
                    "start quorum, --max-workers the rank limit, --min-workers the pause threshold");
    c.app
        ->add_option("--min-workers", a.min_workers,
                     "elastic: pause below N members (default 1; N <= --workers)")
        ->type_name("N")
        ->check(U32Validator());
    AddOptimizerOptions(c.app, &a.optimizer, /*create=*/true);
    AddQuotaOptions(c.app, &a.quotas);
    Handle(handlers, c, [](const Invocation& inv, const Args& a) {
      admin::CreateTenantRequest request;
      request.set_name(a.name);
      if (Given(inv.command, "--consistency")) {
        if (Status s = SetConsistency(a.consistency, &request); !s.ok()) return s;
      }
      request.set_workers_per_rack(a.workers);
      if (Given(inv.command, "--min-workers") && !a.elastic) {
        return InvalidArgument("--min-workers: only with --elastic");
      }
      request.set_elastic(a.elastic);
      request.set_min_workers(a.min_workers);
      if (Given(inv.command, "--chunk-bytes")) request.set_chunk_bytes(a.chunk_bytes);
      if (AnyGiven(inv.command, kOptimizerOptions)) {
        *request.mutable_default_optimizer() = ApplyOptimizerOptions(inv.command, a.optimizer, {});
      }
      *request.mutable_quotas() = ToQuotas(inv.command, a.quotas);
      if (Given(inv.command, "--tenant-token-file")) {
        const Result<std::string> token = ReadLocalFile("tenant-token-file", a.token_file);
        if (!token.ok()) return token.status();
        request.set_token(Trim(*token));
      }
      return CallAndShow(inv, &TenantStub::CreateTenant, request,
                         [](std::ostream& out, const admin::CreateTenantResponse& response) {
                           out << "created tenant '" << response.tenant().name() << "'\n";
                           PrintTenant(out, response.tenant());
                           out << "\ndata-plane token: " << response.token() << "\n"
                               << "This token is shown only once (the daemon keeps only a hash "
                                  "of it): store it now.\n";
                         });
    });
  }
  {
    const auto c = DefineCommand<std::string>(tenant, "get", "show one tenant");
    AddArgument(c.app, "NAME", c.args.get(), "tenant name");
    Handle(handlers, c, [](const Invocation& inv, const std::string& name) {
      return CallAndShow(inv, &TenantStub::GetTenant, Named<admin::GetTenantRequest>(name),
                         PrintTenant);
    });
  }
  Handle(handlers, DefineCommand<std::monostate>(tenant, "list", "list all tenants"),
         [](const Invocation& inv, std::monostate) {
           return CallAndShow(inv, &TenantStub::ListTenants, admin::ListTenantsRequest(),
                              PrintTenantList);
         });
  {
    struct Args {
      std::string name;
      QuotaArgs quotas;
    };
    const auto c = DefineCommand<Args>(
        tenant, "update-quotas", "change quotas; the ones not given keep their current value");
    AddArgument(c.app, "NAME", &c.args->name, "tenant name");
    AddQuotaOptions(c.app, &c.args->quotas);
    c.app->callback([app = c.app] {
      if (!AnyGiven(*app, kQuotaOptions)) {
        throw CLI::ValidationError(
            "give at least one of --max-param-bytes, --max-keys, --max-workers");
      }
    });
    Handle(handlers, c, [](const Invocation& inv, const Args& a) {
      admin::UpdateQuotasRequest request = Named<admin::UpdateQuotasRequest>(a.name);
      *request.mutable_quotas() = ToQuotas(inv.command, a.quotas);
      return CallAndShow(inv, &TenantStub::UpdateQuotas, request,
                         [](std::ostream& out, const admin::Tenant& response) {
                           out << "updated the quotas of tenant '" << response.name() << "'\n";
                           PrintTenant(out, response);
                         });
    });
  }
  {
    const auto c = DefineCommand<std::string>(tenant, "delete", "delete a tenant and all its keys");
    AddArgument(c.app, "NAME", c.args.get(), "tenant name");
    Handle(handlers, c, [](const Invocation& inv, const std::string& name) {
      return CallAndShow(inv, &TenantStub::DeleteTenant, Named<admin::DeleteTenantRequest>(name),
                         [&name](std::ostream& out, const admin::DeleteTenantResponse&) {
                           out << "deleted tenant '" << name << "'\n";
                         });
    });
  }
}

}  // namespace rackhub::cli
