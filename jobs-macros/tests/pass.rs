//! What `#[derive(Job)]` and `#[jobs::handler]` accept: each file of `tests/pass/` is
//! a module of this test, written as a user's crate would write it (through `jobs::`
//! alone, under `#![deny(warnings)]`), and checks what the macros generated.

#[path = "pass/all-settings.rs"]
mod all_settings;
#[path = "pass/basic.rs"]
mod basic;
#[path = "pass/cron.rs"]
mod cron;
#[path = "pass/handler-names.rs"]
mod handler_names;
#[path = "pass/macro-generated.rs"]
mod macro_generated;
#[path = "pass/periodic.rs"]
mod periodic;
#[path = "pass/transaction-mode.rs"]
mod transaction_mode;
