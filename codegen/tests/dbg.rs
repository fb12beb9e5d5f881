#![allow(clippy::unwrap_used)]
#[test]
fn dbg() {
    let path = std::env::var("PLAN").unwrap();
    let plan =
        planner::plan::Plan::from_json(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    let g = codegen::load_graph(&plan).unwrap();
    let set = codegen::lower(&plan, &g, codegen::Options::default()).unwrap();
    let r: u32 = std::env::var("RANK").unwrap().parse().unwrap();
    println!("{}", codegen::listing::show(&set, r).unwrap());
}
