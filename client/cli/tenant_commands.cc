// rackhubctl tenant create|get|list|set-quotas|delete (the admin
// TenantService), registered by Commands (commands.cc).
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

void AddTenantCommands(CLI::App* tenant, std::map<const CLI::App*, Handler>* handlers) {
  {
    struct Args {
      std::string name, token_file, consistency;
      uint32_t workers = 0, chunk_bytes = 0;
      OptimizerArgs optimizer;
      QuotaArgs quotas;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(
        tenant, "create", "create a tenant; prints its data-plane token (shown only this once)",
        "Creates a tenant with N workers per rack and prints the tenant and its data-plane\n"
        "token: the token is shown only this once. Without optimizer options the default\n"
        "optimizer is sgd --lr 0.01; quotas left out (or 0) use the daemon's defaults.");
    AddArgument(c, "NAME", &a->name, "tenant name (1-63 of a-z 0-9 _ -)");
    c->add_option("--workers", a->workers, "workers per rack")
        ->type_name("N")
        ->check(U32Validator())
        ->required();
    c->add_option("--chunk-bytes", a->chunk_bytes,
                  "chunk size, a multiple of 64 in [1KiB, 64MiB] (default 32KiB)")
        ->type_name("SIZE")
        ->transform(Size32Validator());
    c->add_option("--tenant-token-file", a->token_file,
                  "use the token in FILE (32-128 of A-Z a-z 0-9 _ -) instead of minting one:\n"
                  "the same tenant on every rack's hub shares one token")
        ->type_name("FILE");
    c->add_option("--consistency", a->consistency,
                  "how workers wait for each other (default sync; docs/consistency.md)")
        ->type_name("sync|bounded:S|async");
    AddOptimizerOptions(c, &a->optimizer, /*create=*/true);
    AddQuotaOptions(c, &a->quotas);
    (*handlers)[c] = [a](const Invocation& inv) {
      admin::CreateTenantRequest request;
      request.set_name(a->name);
      if (Given(inv.command, "--consistency")) {
        if (Status s = SetConsistency(a->consistency, &request); !s.ok()) return s;
      }
      request.set_workers_per_rack(a->workers);
      if (Given(inv.command, "--chunk-bytes")) request.set_chunk_bytes(a->chunk_bytes);
      if (AnyGiven(inv.command, kOptimizerOptions)) {
        *request.mutable_default_optimizer() = ApplyOptimizerOptions(inv.command, a->optimizer, {});
      }
      *request.mutable_quotas() = ToQuotas(inv.command, a->quotas);
      if (Given(inv.command, "--tenant-token-file")) {
        const Result<std::string> token = ReadLocalFile("tenant-token-file", a->token_file);
        if (!token.ok()) return token.status();
        request.set_token(Trim(*token));
      }
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::CreateTenantResponse response;
      if (Status s = Check(stub->CreateTenant(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "created tenant '" << response.tenant().name() << "'\n";
        PrintTenant(inv.out, response.tenant());
        inv.out << "\ndata-plane token: " << response.token() << "\n"
                << "This token is shown only once (the daemon keeps only a hash of it): store it "
                   "now.\n";
      });
    };
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* c = AddCommand(tenant, "get", "show one tenant");
    AddArgument(c, "NAME", name.get(), "tenant name");
    (*handlers)[c] = [name](const Invocation& inv) {
      admin::GetTenantRequest request;
      request.set_name(*name);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Tenant response;
      if (Status s = Check(stub->GetTenant(&context, request, &response), inv.connection); !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { PrintTenant(inv.out, response); });
    };
  }
  {
    CLI::App* c = AddCommand(tenant, "list", "list all tenants");
    (*handlers)[c] = [](const Invocation& inv) {
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::ListTenantsResponse response;
      if (Status s = Check(stub->ListTenants(&context, admin::ListTenantsRequest(), &response),
                           inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { PrintTenantList(inv.out, response); });
    };
  }
  {
    struct Args {
      std::string name;
      QuotaArgs quotas;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(tenant, "update-quotas",
                             "change quotas; the ones not given keep their current value");
    AddArgument(c, "NAME", &a->name, "tenant name");
    AddQuotaOptions(c, &a->quotas);
    c->callback([c] {
      if (!AnyGiven(*c, kQuotaOptions)) {
        throw CLI::ValidationError(
            "give at least one of --max-param-bytes, --max-keys, --max-workers");
      }
    });
    (*handlers)[c] = [a](const Invocation& inv) {
      admin::UpdateQuotasRequest request;
      request.set_name(a->name);
      *request.mutable_quotas() = ToQuotas(inv.command, a->quotas);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Tenant response;
      if (Status s = Check(stub->UpdateQuotas(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "updated the quotas of tenant '" << response.name() << "'\n";
        PrintTenant(inv.out, response);
      });
    };
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* c = AddCommand(tenant, "delete", "delete a tenant and all its keys");
    AddArgument(c, "NAME", name.get(), "tenant name");
    (*handlers)[c] = [name](const Invocation& inv) {
      admin::DeleteTenantRequest request;
      request.set_name(*name);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::DeleteTenantResponse response;
      if (Status s = Check(stub->DeleteTenant(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { inv.out << "deleted tenant '" << request.name() << "'\n"; });
    };
  }
}

}  // namespace rackhub::cli
