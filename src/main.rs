use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = portcullis::cli::Cli::parse();
    if let Err(reason) = portcullis::cli::run(cli) {
        // One line, whatever the reason's source put in it: scripts read the last line.
        let one_line = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        eprintln!("portcullis: {one_line}");
        std::process::exit(1);
    }
}
