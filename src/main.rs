use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = portcullis::cli::Cli::parse();
    if let Err(reason) = portcullis::cli::run(cli) {
        eprintln!("portcullis: {reason}");
        std::process::exit(1);
    }
}
