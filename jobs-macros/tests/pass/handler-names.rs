// Handlers whose names are those of the generated code's locals still register.
#![deny(warnings)]

use jobs::{Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "names.a")]
struct A;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "names.b")]
struct B;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "names.c")]
struct C;

#[derive(Job, Serialize, Deserialize)]
#[job(kind = "names.d")]
struct D;

#[jobs::handler]
async fn input(_job: A, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[jobs::handler]
async fn job(job: B, ctx: JobContext) -> Result<(), JobError> {
    let _ = (job, ctx);
    Ok(())
}

#[jobs::handler]
async fn ctx(_job: C, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[jobs::handler]
async fn dispatch(_job: D, _ctx: JobContext) -> Result<(), JobError> {
    Ok(())
}
